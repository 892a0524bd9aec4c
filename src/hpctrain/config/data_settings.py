"""The recipe's `data` section: what the samples are, where they come from, how they are
augmented and loaded.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from hpctrain import user_code
from hpctrain.config.base import Auto, Section


# samples a built-in dataset may make (ImageNet has 1.3 M): more is refused before any work,
# where 10^12 was a MemoryError after a temporary folder was left in the cache
MOST_SAMPLES = 10_000_000


class ShapesConfig(Section):
    num_train: int = Field(10000, ge=10, le=MOST_SAMPLES)
    num_val: int = Field(2000, ge=10, le=MOST_SAMPLES)
    image_size: int = Field(32, ge=8, le=512)
    seed: int = 0
    cache_dir: str = Field("~/.cache/hpctrain",
                           description="where the generated dataset is kept between runs")


class SyntheticConfig(Section):
    num_train: int = Field(2560, ge=1, le=MOST_SAMPLES)
    num_val: int = Field(512, ge=1, le=MOST_SAMPLES)
    num_classes: int = Field(1000, ge=2)


class TokensConfig(Section):
    """Language-model data: how a token pack becomes samples."""

    seq_len: int = Field(256, ge=2, description="tokens a sample feeds the model (its "
                         "context length in training)")
    batching: Literal["blocks", "documents"] = Field(
        "blocks", description="blocks: the corpus as one stream cut into seq_len blocks (no "
        "padding); documents: one sample per document, batched by length and padded per batch")
    bucket_pool_batches: int = Field(50, ge=1, description="documents: batches sorted by "
                                     "length together (more: less padding, less randomness)")
    vocab_size: int | None = Field(None, ge=2, description="your own token data: its "
                                   "vocabulary (None: the training dataset's vocab_size)")


class ArithmeticConfig(Section):
    """The built-in corpus of sums and differences (data.dataset=arithmetic)."""

    num_train: int = Field(200_000, ge=10, le=MOST_SAMPLES, description="training documents "
                           "(problems, drawn with repeats from those not held out)")
    num_val: int = Field(2000, ge=10, le=MOST_SAMPLES, description="distinct held-out problems")
    max_operand: int = Field(99, ge=2, le=999, description="every problem up to it is "
                             "written out once: 999 makes 1 M per operation")
    operations: str = Field("+-", pattern=r"^[+*-]+$")
    seed: int = 0
    cache_dir: str = Field("~/.cache/hpctrain",
                           description="where the generated corpus is kept between runs")


class Shapes3dConfig(Section):
    """The built-in point clouds of 3D primitives (data.dataset=shapes3d)."""

    num_train: int = Field(5000, ge=10, le=MOST_SAMPLES)
    num_val: int = Field(1000, ge=10, le=MOST_SAMPLES)
    seed: int = 0
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
    jitter_clip: float = Field(0.05, gt=0)
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


class AugmentConfig(Section):
    random_resized_crop: bool = True
    crop_scale: tuple[float, float] = (0.08, 1.0)
    hflip: bool = True
    mixup_alpha: float = Field(0.0, ge=0, description="mixup's Beta(alpha, alpha); 0: off "
                               "(0.2 is usual)")
    cutmix_alpha: float = Field(0.0, ge=0, description="CutMix's Beta(alpha, alpha); 0: off "
                                "(1.0 is usual)")
    mix_prob: float = Field(1.0, ge=0, le=1, description="share of batches mixed")
    mix_switch_prob: float = Field(0.5, ge=0, le=1, description="with both on: share of "
                                   "mixed batches that use CutMix")

    @model_validator(mode="after")
    def _scale_range(self):
        lo, hi = self.crop_scale
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < min <= max <= 1, got {self.crop_scale}")
        return self


class ProgressiveConfig(Section):
    """FFCV-style progressive resizing: train size grows linearly from start to end size."""

    enabled: bool = False
    start_size: int = Field(160, ge=8)
    end_size: int = Field(192, ge=8)
    start_epoch: int = Field(0, ge=0)
    end_epoch: int = Field(10, ge=1)
    multiple_of: int = Field(32, ge=1)


BUILTIN_DATASETS = ("shapes", "imagefolder", "shards", "synthetic", "tokens", "arithmetic",
                    "shapes3d", "modelnet")


class DataConfig(Section):
    dataset: str = Field("shapes", description=f"{', '.join(BUILTIN_DATASETS)}, or your own "
                         "factory returning (train, val) Datasets: package.module:make or "
                         "path/to/file.py:make (a relative path is read from the recipe's "
                         "folder)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="your dataset factory's "
                                   "keyword arguments")
    path: str | None = Field(None, description="imagefolder: its root (with train/ and val/, "
                                               "or class folders and a val_fraction); shards: "
                                               "the folder written by hpctrain pack; tokens: "
                                               "the one written by hpctrain pack --tokens; "
                                               "modelnet: ModelNet's .off class folders or "
                                               "HDF5 files")
    decode: Literal["cpu", "gpu"] = Field("cpu", description="shards: where JPEGs are "
                                          "decoded; gpu: batched nvJPEG on the device")
    cache: str = Field("off", description="shards: copy the pack once per node to local "
                       "storage: auto (the job's scratch folder, else $TMPDIR), a path, or off")
    num_classes: int | None = Field(None, ge=1, description="expected number of classes, "
                                    "checked against the data (None: take the data's)")
    val_fraction: float | None = Field(None, gt=0, lt=1)
    image_size: int = Field(32, ge=8, le=1024)
    val_image_size: int | None = Field(None, ge=8, le=1024)
    val_resize_ratio: float = Field(1.0, gt=0, le=1,
                                    description="crop fraction for validation (0.875 for "
                                                "ImageNet; 1 = resize only)")
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    num_workers: int | Auto = "auto"
    prefetch_factor: int = Field(4, ge=1)
    persistent_workers: bool = True
    worker_start: Literal["auto", "fork", "forkserver", "spawn"] = Field(
        "auto", description="how DataLoader workers start; auto: Python's default (fork on "
        "Linux before 3.14), spawn or forkserver for code that must not be forked")
    pin_memory: bool | Auto = "auto"
    loader: Literal["auto", "buffers", "torch"] = Field(
        "auto", description="buffers: workers write each sample straight into batch buffers "
        "in shared memory, reused every step (data/batch_buffers.py); torch: torch's "
        "DataLoader; auto: buffers for packs and image folders decoded on the CPU and for "
        "the blocks of a token pack")
    on_bad_image: Literal["skip", "fail"] = "skip"
    augment: AugmentConfig = AugmentConfig()
    progressive: ProgressiveConfig = ProgressiveConfig()
    shapes: ShapesConfig = ShapesConfig()
    synthetic: SyntheticConfig = SyntheticConfig()
    tokens: TokensConfig = TokensConfig()
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    points: PointsConfig = PointsConfig()
    shapes3d: Shapes3dConfig = Shapes3dConfig()

    _kind_of_user_data: str = PrivateAttr("images")  # set by Config, from the task
    _targets_of_user_data: str = PrivateAttr("classes")  # classes|labels|mask|values|any

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if value in BUILTIN_DATASETS or user_code.is_code_reference(value):
            return value
        hint = difflib.get_close_matches(value, BUILTIN_DATASETS, n=1)
        raise ValueError(f"expected one of {', '.join(BUILTIN_DATASETS)}"
                         + (f" (did you mean {hint[0]!r}?)" if hint else "")
                         + ", or your own factory: package.module:make or path/to/file.py:make")

    @property
    def from_user_code(self) -> bool:
        return user_code.is_code_reference(self.dataset)

    @property
    def targets(self) -> str:
        """What your own samples' targets are: classes (an integer label), labels (a
        multi-hot vector), mask (a class per element), values (numbers: regression) or any
        (a LightningModule's steps take the batch as it is)."""
        return self._targets_of_user_data

    @property
    def kind(self) -> str:
        """What the samples are: images, tokens, points or tensors (your own data: what the
        task learns from, images unless `task` says otherwise)."""
        if self.from_user_code:
            return self._kind_of_user_data
        if self.dataset in TOKEN_DATASETS:
            return "tokens"
        return "points" if self.dataset in POINT_DATASETS else "images"

    @model_validator(mode="after")
    def _needs_path(self):
        if self.dataset in ("imagefolder", "shards", "tokens", "modelnet") and not self.path:
            raise ValueError(f"dataset '{self.dataset}' needs data.path (for example "
                             "data.path=/scratch/imagenet)")
        for name, value, off in (("decode", self.decode, "cpu"), ("cache", self.cache, "off")):
            if value != off and self.dataset != "shards":
                raise ValueError(f"data.{name}={value} applies to dataset 'shards' only (this "
                                 f"recipe reads '{self.dataset}'); pack it with hpctrain pack, "
                                 f"or set data.{name}={off}")
        if isinstance(self.num_workers, int) and self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 or 'auto', got {self.num_workers}")
        return self


TOKEN_DATASETS = ("tokens", "arithmetic")


POINT_DATASETS = ("shapes3d", "modelnet")
