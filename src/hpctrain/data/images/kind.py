"""Images: the data kind of image classification. Its settings (augmentation, progressive
resizing, the built-in `shapes` and `synthetic` datasets), its datasets (data/images/
datasets.py) and its device batcher (data/images/batcher.py) are asked through `SPEC`."""

from __future__ import annotations

from hpctrain.data.images.settings import (AugmentConfig, ImagesConfig, ProgressiveConfig,
                                           ShapesConfig, SyntheticConfig)
from hpctrain.data.kind import DataKind, own_check, three_quarters


def image_size_for_epoch(data, epoch: int | None) -> int:
    """The training resolution of `epoch`: fixed, or growing linearly (progressive resizing);
    None: validation's."""
    if epoch is None:
        return data.images.val_image_size or data.images.image_size
    p = data.progressive
    if not p.enabled:
        return data.images.image_size
    t = min(max((epoch - p.start_epoch) / max(p.end_epoch - p.start_epoch, 1), 0.0), 1.0)
    size = p.start_size + t * (p.end_size - p.start_size)
    return max(p.multiple_of, int(round(size / p.multiple_of)) * p.multiple_of)


def image_sizes(data) -> tuple[int, ...]:
    """Every image size a run feeds the model: training (each epoch's, under progressive
    resizing) and validation."""
    epochs = range(data.progressive.end_epoch + 1) if data.progressive.enabled else [0]
    return tuple(sorted({*(image_size_for_epoch(data, e) for e in epochs),
                         image_size_for_epoch(data, None)}))


def _sample_shape(data) -> tuple[int, ...]:
    """(channels, height, width) at the largest training size (where the peak comes)."""
    size = data.images.image_size
    if data.progressive.enabled:
        size = max(size, data.progressive.start_size, data.progressive.end_size)
    return (3, size, size)


def _width(data):
    """The classes of the built-in generated datasets, which need no reading."""
    from hpctrain.data.images.shapes import CLASSES

    if data.dataset == "synthetic":
        return data.synthetic.num_classes, None
    if data.dataset == "shapes":
        return len(CLASSES), None
    return None


def _smaller_sample(data, shape: tuple[int, ...]):
    size, lower = shape[-1], three_quarters(shape[-1])
    if lower >= size:
        return None
    return "data.images.image_size", lower, f"{(lower / size) ** 2:.0%} of the pixels per image"


def _stand_in(data, batch: int, batches: int, num_classes: int | None):
    """Synthetic images of the recipe's size, `batches` batches of them and one to
    validate: the model's rate without decoding."""
    return data.model_copy(update=dict(
        dataset="synthetic", path=None, num_classes=None,
        images=data.images.model_copy(update=dict(cache="off")),
        synthetic=data.synthetic.model_copy(update=dict(
            num_train=batch * batches, num_val=batch, num_classes=num_classes))))


def _datasets_of(data, seed: int, rank: int, scratch):
    from hpctrain.data.images.datasets import image_datasets

    return image_datasets(data, seed, scratch)


def _collate(data):
    """Bytes and views under data.images.decode=gpu, else the default stacking."""
    from hpctrain.data.images.device_decode import collate_encoded

    return collate_encoded if data.images.decode == "gpu" else None


def _settings_problem(data) -> str | None:
    """How a pack is read applies to packs only."""
    for name, value, off in (("decode", data.images.decode, "cpu"),
                             ("cache", data.images.cache, "off")):
        if value != off and data.dataset != "shards":
            return (f"data.images.{name}={value} applies to dataset 'shards' only (this "
                    f"recipe reads '{data.dataset}'); pack it with hpctrain pack, or set "
                    f"data.images.{name}={off}")
    return None


def _batcher(device, data, channels_last: bool):
    from hpctrain.data.images.batcher import DeviceBatcher

    return DeviceBatcher(device, data.images.mean, data.images.std, channels_last)


SPEC = DataKind(
    name="images", samples_word="images",
    model_hint="an image model (hpctrain:resnet_small, timm:NAME, torchvision:NAME)",
    unit=lambda data: "image", batcher=_batcher,
    datasets=("shapes", "imagefolder", "shards", "synthetic"),
    needs_path=("imagefolder", "shards"),
    settings={"images": ImagesConfig, "augment": AugmentConfig, "progressive": ProgressiveConfig,
              "shapes": ShapesConfig, "synthetic": SyntheticConfig},
    channels_first=True, datasets_of=_datasets_of, collate=_collate,
    key_size=image_size_for_epoch,
    image_sizes=image_sizes, sample_shape=_sample_shape, width=_width,
    shapes=lambda data: "unknown" if data.from_user_code else
    "few" if data.progressive.enabled else "fixed",
    smaller_sample=_smaller_sample, stand_in=_stand_in, settings_problem=_settings_problem,
    own_sample_problem=own_check("image_sample_problem"),
    own_expected=lambda data: "(image, label): a uint8 (H, W, 3) image, or a float (3, H, "
                              "W) one already normalised, and an integer label",
    own_hint=own_check("other_task_hint"))
