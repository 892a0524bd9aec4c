"""Images' sections of the recipe's data section (`data.images`, `data.augment`,
`data.progressive`, `data.shapes`, `data.synthetic`), apart from their spec (kind.py) so that
the datasets can name them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hpctrain.data.kind import MOST_SAMPLES
from hpctrain.sections import Section


class ImagesConfig(Section):
    """What every image dataset shares: the sizes fed to the model, the normalisation, and
    how a pack is read (`decode`, `cache`: dataset `shards` only). Until issue 66 these were
    keys of `data` itself (config/loading.py's RENAMED still reads them there)."""

    image_size: int = Field(32, ge=8, le=1024, description="the side in pixels of the "
                            "images the model is trained on")
    val_image_size: int | None = Field(None, ge=8, le=1024, description="the side of the "
                                       "images it is evaluated on (None: image_size)")
    val_resize_ratio: float = Field(1.0, gt=0, le=1,
                                    description="crop fraction for validation (0.875 for "
                                                "ImageNet; 1 = resize only)")
    mean: tuple[float, float, float] = Field((0.485, 0.456, 0.406), description="per channel "
                                             "(RGB), subtracted from pixels in 0..1 "
                                             "(ImageNet's by default)")
    std: tuple[float, float, float] = Field((0.229, 0.224, 0.225), description="per channel, "
                                            "what pixels are divided by after the mean")
    decode: Literal["cpu", "gpu"] = Field("cpu", description="shards: where JPEGs are "
                                          "decoded; gpu: batched nvJPEG on the device")
    cache: str = Field("off", description="shards: copy the pack once per node to local "
                       "storage: auto (the job's scratch folder, else $TMPDIR), a path, or off")
    on_bad_image: Literal["skip", "fail"] = Field("skip", description="an image that cannot "
                                                  "be decoded: skip (counted in the summary's "
                                                  "skipped_images) or fail the run")


class ShapesConfig(Section):
    num_train: int = Field(10000, ge=10, le=MOST_SAMPLES, description="training images "
                           "generated")
    num_val: int = Field(2000, ge=10, le=MOST_SAMPLES, description="validation images "
                         "generated")
    image_size: int = Field(32, ge=8, le=512, description="the generated JPEGs' side in "
                            "pixels")
    seed: int = Field(0, description="the generator's seed: another seed, other images")
    cache_dir: str = Field("~/.cache/hpctrain",
                           description="where the generated dataset is kept between runs")


class SyntheticConfig(Section):
    num_train: int = Field(2560, ge=1, le=MOST_SAMPLES, description="random training "
                           "tensors (made on the fly: speed measurements, not learning)")
    num_val: int = Field(512, ge=1, le=MOST_SAMPLES, description="random validation tensors")
    num_classes: int = Field(1000, ge=2, description="the labels' range")


class AugmentConfig(Section):
    random_resized_crop: bool = Field(True, description="training crops of a random area "
                                      "and aspect ratio, resized to image_size (else a "
                                      "resize)")
    crop_scale: tuple[float, float] = Field((0.08, 1.0), description="the crop's area as a "
                                            "share of the image: (least, most)")
    hflip: bool = Field(True, description="mirror half the training images left to right")
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

    enabled: bool = Field(False, description="grow the training image size over epochs")
    start_size: int = Field(160, ge=8, description="the side at start_epoch and before")
    end_size: int = Field(192, ge=8, description="the side at end_epoch and after")
    start_epoch: int = Field(0, ge=0, description="the epoch the growth starts")
    end_epoch: int = Field(10, ge=1, description="the epoch it reaches end_size")
    multiple_of: int = Field(32, ge=1, description="sizes rounded to a multiple of this (few "
                             "shapes: few compiled graphs)")
