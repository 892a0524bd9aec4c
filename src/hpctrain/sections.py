"""What every section of a recipe is built on: a strict pydantic model. On the ground floor,
so that each room owning a section (config/, and data/ for its kinds' sections) builds on it.
"""

from __future__ import annotations

import types
import typing
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

Auto = Literal["auto"]


class Section(BaseModel):
    # inf and nan are never meant: train.epochs=.inf would train forever
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_flag_for_a_number(cls, value, info: ValidationInfo):
        """true/false where a number belongs is refused: pydantic reads true as 1, so
        `batch_size: true` trained at batch 1."""
        if isinstance(value, bool) and _takes_numbers_not_flags(
                cls.model_fields[info.field_name].annotation):
            raise ValueError(f"{str(value).lower()} is a flag, not a number: give a number")
        return value


def _takes_numbers_not_flags(annotation) -> bool:
    """Whether a field of this type takes an int or a float, and not a bool."""
    members = typing.get_args(annotation) \
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    return bool({int, float} & set(members)) and bool not in members
