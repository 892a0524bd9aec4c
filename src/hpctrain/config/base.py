"""Plain names in a recipe (a run's folder).
"""

from __future__ import annotations


def plain_name(value: str | None, what: str) -> str | None:
    """A name that becomes one folder inside output_dir: no path, nothing hidden."""
    if value is None:
        return value
    if not value or value in (".", "..") or any(c in value for c in "/\\\0") or \
            value.startswith(".") or any(ord(c) < 32 for c in value):
        raise ValueError(f"{value!r} is not a plain name: {what} names a folder inside "
                         "output_dir, so it may not hold '/', start with '.' or be empty")
    return value
