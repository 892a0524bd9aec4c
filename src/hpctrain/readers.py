"""Reading the files hpctrain reads back: bounded, and damage named, never a traceback.

A file hpctrain wrote may come back cut short by a crash, empty, of another shape, or made by
someone else: a link to /dev/zero, a file of 100 GB, JSON nested 200,000 deep, a YAML alias
bomb. So every read here takes a regular file only (not a link, a device or a FIFO), no more
than the cap of its kind, and parses it no deeper than MAX_DEPTH levels; YAML is read by a
loader that also refuses aliases expanding past MAX_VALUES values, duplicate keys and
integers longer than MAX_DIGITS. What breaks a limit is `Unreadable`, with the reason.

A file that informs but is not essential (a run's summary.json or config.yaml, read by
`status`, `profile --trace` or a resume) is read as absent when it cannot be read. A file
whose fields must hold (run.json, metrics.jsonl, a checkpoint's meta.json) states its rules
with the kinds below, beside its reader, and a record that breaks one is named.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MAX_DEPTH = 64  # levels of nesting in a JSON or YAML value read back (a recipe uses 4)
MAX_VALUES = 100_000  # values a YAML document may expand to through its aliases
MAX_DIGITS = 40  # digits of an integer in YAML (Python refuses more than 4,300 with a traceback)


class Unreadable(ValueError):
    """A file, or a value in it, that breaks a limit of reading: says what, e.g. 'is not a
    regular file', 'is nested deeper than 64 levels'."""


def open_capped(path: Path, cap: int):
    """`path` opened to read in binary, when it is a regular file of at most `cap` bytes:
    FileNotFoundError when absent, Unreadable when a link, not a regular file (a device such
    as /dev/zero, a FIFO, a folder) or larger."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Unreadable("is a symbolic link, which hpctrain does not follow") from None
        raise
    handle = os.fdopen(descriptor, "rb")
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_size > cap:
        handle.close()
        raise Unreadable("is not a regular file" if not stat.S_ISREG(info.st_mode) else
                         f"holds {info.st_size:,} bytes, more than the {cap:,} it may")
    return handle


def read_capped(path: Path, cap: int) -> bytes:
    """The bytes of the regular file `path`, at most `cap` (see open_capped)."""
    with open_capped(path, cap) as handle:
        chunks, size = [], 0
        while size <= cap:  # in pieces: read(n) would set n bytes aside first
            chunk = handle.read(min(MiB, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if size > cap:  # grew since it was opened
        raise Unreadable(f"holds more than the {cap:,} bytes it may")
    return b"".join(chunks)


def read_data(path: Path, cap: int) -> bytes:
    """The bytes of a file of the user's own dataset (a mesh, a names list): a dataset laid
    out with links is the user's choice, so a link is followed, but only to a regular file of
    at most `cap` bytes (Unreadable otherwise)."""
    with open(path, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > cap:
            raise Unreadable("is not a regular file" if not stat.S_ISREG(info.st_mode) else
                             f"holds {info.st_size:,} bytes, more than the {cap:,} it may")
        data = handle.read(cap + 1)
    if len(data) > cap:
        raise Unreadable(f"holds more than the {cap:,} bytes it may")
    return data


def read_text_capped(path: Path, cap: int = 64 * KiB) -> str:
    """The text of the regular file `path` (a /proc or /sys entry, a log's few lines), at most
    `cap` bytes, undecodable bytes replaced; raises as read_capped."""
    return read_capped(path, cap).decode(errors="replace")


def capped_lines(path: Path, cap: int, line_cap: int) -> Iterator[bytes | None]:
    """The lines of the regular file `path` (see open_capped), reading at most `cap` bytes in
    all; None in place of a line longer than `line_cap`, which is skipped."""
    with open_capped(path, cap) as handle:
        left = cap
        while left > 0:
            line = handle.readline(min(line_cap + 1, left))
            if not line:
                return
            left -= len(line)
            if len(line) <= line_cap or line.endswith(b"\n"):
                yield line
                continue
            while line and not line.endswith(b"\n") and left > 0:  # the rest of it
                line = handle.readline(min(MiB, left))
                left -= len(line)
            yield None


def chunks(path: Path, start: int = 0) -> Iterator[bytes]:
    """The regular file `path` (a log: no link, no device) from byte `start` to its end as it
    is now, a MiB at a time, however large: for printing, never kept whole."""
    with open_capped(path, 1 << 62) as handle:
        handle.seek(start)
        while chunk := handle.read(MiB):
            yield chunk


def tail_text(path: Path, most_bytes: int = 64 * KiB) -> str:
    """The end of the regular file `path` (a log), at most `most_bytes` of it from a line's
    start, as text with undecodable bytes replaced; '' when it cannot be read. A log of many
    GB is read no further than its end."""
    try:
        with open_capped(path, 1 << 62) as handle:  # any size: only its end is read
            start = max(0, os.fstat(handle.fileno()).st_size - most_bytes)
            handle.seek(start)
            data = handle.read(most_bytes)
    except (OSError, Unreadable):
        return ""
    if start:
        data = data.partition(b"\n")[2]  # a line cut by the start
    return data.decode(errors="replace")


def parse_json(text: str | bytes):
    """The JSON value of `text`; ValueError when it is not JSON or nested deeper than
    MAX_DEPTH (where json would raise RecursionError)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise Unreadable(f"is nested deeper than {MAX_DEPTH} levels") from None
    if deeper_than(value, MAX_DEPTH):
        raise Unreadable(f"is nested deeper than {MAX_DEPTH} levels")
    return value


def deeper_than(value, limit: int) -> bool:
    """Whether lists and mappings nest in `value` more than `limit` levels (walked without
    recursion; a value that holds itself counts as too deep)."""
    stack, seen = [(value, 1)], set()
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            if depth > limit or id(item) in seen:
                return True
            seen.add(id(item))
            stack.extend((child, depth + 1) for child in
                         (item.values() if isinstance(item, dict) else item))
    return False


def json_document(path: Path, cap: int) -> tuple[object, str | None]:
    """(the JSON value in `path`, None); (None, why) when it is there but cannot be read
    (cut short, not JSON, a limit broken: 'is not a regular file'); (None, None) when absent."""
    try:
        return parse_json(read_capped(path, cap)), None
    except FileNotFoundError:
        return None, None
    except Unreadable as err:
        return None, str(err)
    except ValueError:  # not JSON, not UTF-8
        return None, "is not valid JSON (cut short?)"
    except OSError as err:
        return None, f"cannot be read ({err.strerror or err})"


def json_mapping(path: Path, cap: int) -> dict | None:
    """The JSON object in `path`, or None when it is missing or not a JSON object."""
    value, _ = json_document(path, cap)
    return value if isinstance(value, dict) else None


class LimitBroken(yaml.MarkedYAMLError):
    """YAML that breaks a limit of reading (below): refused, never read another way."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with limits: nesting, what aliases expand to, duplicate keys
    (where YAML keeps the last silently: a second `train:` would drop the first one's keys),
    integers of more than MAX_DIGITS digits. Each is refused as a YAMLError naming the
    line."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise LimitBroken(
                    None, None, f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def compose_document(self):
        node = super().compose_document()
        expanded = _expanded(node)
        if expanded > MAX_VALUES:
            raise LimitBroken(
                None, None, "an alias refers to a value it is inside of" if expanded == math.inf
                else f"it holds more than {MAX_VALUES:,} values (its aliases expanded)",
                node.start_mark)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in seen:
                        raise LimitBroken(
                            "while reading a mapping", node.start_mark,
                            f"found the key {key.value[:60]!r} twice (the first would be "
                            "dropped)", key.start_mark)
                    seen.add(key.value)
        return super().construct_mapping(node, deep)

    def construct_bounded_int(self, node):
        digits = sum(c.isdigit() for c in str(node.value))
        if digits > MAX_DIGITS:
            raise LimitBroken(
                None, None, f"an integer of {digits:,} digits (at most {MAX_DIGITS})",
                node.start_mark)
        return self.construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_bounded_int)


def _expanded(root) -> float:
    """How many values the node graph `root` stands for once every alias is expanded
    (each distinct node visited once, so in time linear in the file, where expanding a
    bomb of nine aliases nine deep would take 9^9); infinite when a node holds itself."""
    done: dict[int, int] = {}
    opened: set[int] = set()
    stack = [root]
    while stack:
        node = stack[-1]
        if id(node) in done:
            stack.pop()
            continue
        children = [] if isinstance(node, yaml.ScalarNode) else \
            [part for pair in node.value for part in pair] \
            if isinstance(node, yaml.MappingNode) else list(node.value)
        if id(node) not in opened:
            opened.add(id(node))
            if any(id(child) in opened and id(child) not in done for child in children):
                return math.inf  # an alias to a node it is inside of
            stack.extend(child for child in children if id(child) not in done)
            continue
        stack.pop()
        done[id(node)] = min(1 + sum(done[id(child)] for child in children), MAX_VALUES + 1)
    return done[id(root)]


def load_yaml(text: str):
    """The YAML value of `text`, read within the limits above (a YAMLError naming the line
    and the limit otherwise)."""
    return yaml.load(text, Loader=_BoundedLoader)


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAMLError in one line: what is wrong, and where (line and column)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return problem + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark else "")


def yaml_mapping(path: Path, cap: int) -> dict | None:
    """The YAML mapping in `path`, or None when it is missing, not a YAML mapping or breaks a
    limit of reading."""
    try:
        value = load_yaml(read_capped(path, cap).decode())
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
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
YEAR_SECONDS = 366 * 86400
# a span a job or a run records (its seconds, a phase's): past a year it is damage, where 1e308
# seconds read back as 100 % of a run's time spent training and 100 % starting at once
SECONDS = Kind("a number of seconds from 0 to a year", lambda v: _real(v) and
               0 <= v <= YEAR_SECONDS)
SHARE = Kind("a fraction from 0 to 1", lambda v: _real(v) and 0 <= v <= 1)


def one_of(*values) -> Kind:
    """Exactly one of `values` (text or numbers, compared by type as well)."""
    return Kind("one of " + ", ".join(map(str, values)),
                lambda v: any(type(v) is type(x) and v == x for x in values))


def whole(low: int, high: int) -> Kind:
    """A whole number from `low` to `high` (a flag or a float is not one)."""
    return Kind(f"a whole number from {low:,} to {high:,}", lambda v: isinstance(v, int) and
                not isinstance(v, bool) and low <= v <= high)


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
