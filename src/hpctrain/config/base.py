"""What every section of a recipe is built on: a strict pydantic model, and plain names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Auto = Literal["auto"]


class Section(BaseModel):
    # inf and nan are never meant: train.epochs=.inf would train forever
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def plain_name(value: str | None, what: str) -> str | None:
    """A name that becomes one folder inside output_dir: no path, nothing hidden."""
    if value is None:
        return value
    if not value or value in (".", "..") or any(c in value for c in "/\\\0") or \
            value.startswith(".") or any(ord(c) < 32 for c in value):
        raise ValueError(f"{value!r} is not a plain name: {what} names a folder inside "
                         "output_dir, so it may not hold '/', start with '.' or be empty")
    return value
