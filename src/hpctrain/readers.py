"""Reading a file that informs but is not essential (a run's summary.json or config.yaml, read
by `status`, `profile --trace` or a resume): a crash, a full disk or a stranger may have left
it cut short, empty or of another shape. Such a file is read as absent, never as a traceback.
"""

from __future__ import annotations

import json
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
