"""Reading a file that informs but is not essential (a run's summary.json or config.yaml, read
by `status`, `profile --trace` or a resume): a crash, a full disk or a stranger may have left
it cut short, empty or of another shape. Such a file is read as absent, never as a traceback.

A file whose fields must hold (run.json, metrics.jsonl, a checkpoint's meta.json) states its
rules with the kinds below, beside its reader, and a record that breaks one is named.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml


def json_mapping(path: Path) -> dict | None:
    """The JSON object in `path`, or None when it is missing or not a JSON object."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def yaml_mapping(path: Path) -> dict | None:
    """The YAML mapping in `path`, or None when it is missing or not a YAML mapping."""
    try:
        value = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return value if isinstance(value, dict) else None


# ---- what a record read back must hold: each file's rules are written with these kinds, and
# a record that breaks one is named ("run.json: created is 1e+300, not a time"), never used


@dataclass(frozen=True)
class Kind:
    """A kind of value a record's field may hold, and its name in a message."""

    name: str
    holds: Callable[[object], bool]

    def __or__(self, other: Kind) -> Kind:
        return Kind(f"{self.name} or {other.name}", lambda v: self.holds(v) or other.holds(v))


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


NONE = Kind("null", lambda v: v is None)
TEXT = Kind("text", lambda v: isinstance(v, str))
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
MAPPING = Kind("a mapping", lambda v: isinstance(v, dict))
NUMBER = Kind("a number", _real)  # NaN and infinities too: a loss may be NaN
FINITE = Kind("a finite number", lambda v: _real(v) and math.isfinite(v))
AMOUNT = Kind("a finite number >= 0", lambda v: _real(v) and math.isfinite(v) and v >= 0)
# whole numbers that SQLite, JSON readers and float arithmetic all hold exactly
COUNT = Kind("a whole number from 0 to 2^53", lambda v: isinstance(v, int) and
             not isinstance(v, bool) and 0 <= v <= 2**53)
# seconds since 1970 that time.localtime can turn into a date (to the year 3000)
TIME = Kind("a time (seconds since 1970)", lambda v: _real(v) and 0 <= v <= 32503680000)


def list_of(kind: Kind) -> Kind:
    return Kind(f"a list, each {kind.name}",
                lambda v: isinstance(v, list) and all(kind.holds(x) for x in v))


def optional(kind: Kind) -> Kind:
    return kind | NONE


def field_problem(record: dict, rules: dict[str, Kind], required: tuple[str, ...] = ()) \
        -> str | None:
    """The first field of `record` that breaks its rule (a field absent is fine unless
    `required`), said as 'KEY is VALUE, not KIND'; None when every field holds."""
    for key in required:
        if key not in record:
            return f"{key} is missing"
    for key, kind in rules.items():
        if key in record and not kind.holds(record[key]):
            return f"{key} is {_shown(record[key])}, not {kind.name}"
    return None


def _shown(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."
