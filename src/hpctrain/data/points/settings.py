"""Point clouds' sections of the recipe's data section (`data.points`, `data.shapes3d`),
apart from their spec (kind.py) so that the datasets can name them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hpctrain.data.kind import MOST_SAMPLES
from hpctrain.sections import Section


class Shapes3dConfig(Section):
    """The built-in point clouds of 3D primitives (data.dataset=shapes3d)."""

    num_train: int = Field(5000, ge=10, le=MOST_SAMPLES, description="training clouds "
                           "generated")
    num_val: int = Field(1000, ge=10, le=MOST_SAMPLES, description="validation clouds "
                         "generated")
    seed: int = Field(0, description="the generator's seed: another seed, other clouds")
    cache_dir: str = Field("~/.cache/hpctrain",
                           description="where the generated dataset is kept between runs")


class PointsConfig(Section):
    """Point-cloud data: the points per cloud, and how training perturbs the clouds (on the
    device, each cloud drawn anew)."""

    num_points: int = Field(1024, ge=16, description="points per cloud fed to the model")
    up_axis: Literal["auto", "x", "y", "z"] = Field(
        "auto", description="the axis rotations turn about; auto: y for ModelNet's HDF5 "
        "files (PointNet's convention), z otherwise")
    rotate: bool = Field(True, description="turn each cloud by a random angle about the up "
                         "axis")
    scale: tuple[float, float] = Field((0.8, 1.25), description="each cloud scaled by a "
                                       "factor drawn from this range")
    jitter_sigma: float = Field(0.01, ge=0, description="Gaussian noise on every point")
    jitter_clip: float = Field(0.05, gt=0, description="the noise clipped to this (PointNet's "
                               "0.05)")
    dropout_max: float = Field(0.875, ge=0, lt=1, description="each cloud loses a random "
                               "share of its points up to this (replaced by its first point)")
    cache_dir: str = Field("~/.cache/hpctrain", description="ModelNet meshes: where their "
                           "sampled clouds are kept between runs")

    @model_validator(mode="after")
    def _scale_range(self):
        lo, hi = self.scale
        if not 0 < lo <= hi:
            raise ValueError(f"scale must satisfy 0 < min <= max, got {self.scale}")
        return self
