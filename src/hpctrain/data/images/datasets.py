"""The built-in image datasets: generated shapes, synthetic tensors, an image folder, or a
pack written by `hpctrain pack` (read in place or from a node-local copy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from hpctrain.data.images.image_folders import (ImageFolderDataset, SyntheticDataset,
                                                image_folder_splits)
from hpctrain.data.images.image_pack import Pack
from hpctrain.data.images.image_pack_dataset import ShardDataset
from hpctrain.data.images.shapes import CLASSES as SHAPE_CLASSES
from hpctrain.data.images.shapes import ensure_shapes
from hpctrain.data.node_cache import node_local_pack
from hpctrain.data.splits import check_classes, hold_out
from hpctrain.errors import DataError


def image_datasets(data, seed: int, scratch: Path | None) -> tuple[Dataset, Dataset, int]:
    """(train, val, number of classes) of data.dataset; `scratch`: the node-local folder a
    pack is copied to under data.images.cache=auto."""
    if data.dataset == "synthetic":
        s = data.synthetic
        return (SyntheticDataset(s.num_train, s.num_classes, seed),
                SyntheticDataset(s.num_val, s.num_classes, seed + 1), s.num_classes)
    if data.dataset == "shapes":
        s = data.shapes
        root = ensure_shapes(Path(s.cache_dir).expanduser(), s.seed, s.num_train, s.num_val,
                             s.image_size)
        num_classes, train, val = _image_folder_samples(root, None, seed)
        assert num_classes == len(SHAPE_CLASSES)
    elif data.dataset == "shards":
        return check_classes(data, *_shard_datasets(data, seed, scratch))
    else:
        num_classes, train, val = _image_folder_samples(Path(data.path).expanduser(),
                                                        data.val_fraction, seed)
    make = lambda samples, is_train: ImageFolderDataset(
        samples, is_train, data.augment, seed, data.images.val_resize_ratio,
        data.images.on_bad_image)
    return check_classes(data, make(train, True), make(val, False), num_classes)


def _image_folder_samples(root: Path, val_fraction: float | None, seed: int):
    """(num_classes, train samples, val samples) from train/ + val/, or one tree split."""
    classes, splits = image_folder_splits(root)
    if "val" in splits:
        return len(classes), splits["train"], splits["val"]
    if val_fraction is None:
        if (root / "train").is_dir():
            raise DataError(f"data.path: {root} has train/ but no val/ folder; add one or set "
                            "data.val_fraction=0.1 to hold out part of train/")
        raise DataError(f"data.path: {root} has no train/ and val/ folders; set "
                        "data.val_fraction=0.1 to hold out part of it for validation")
    return (len(classes), *hold_out(splits["train"], val_fraction, seed))


def _shard_datasets(data, seed: int, scratch: Path | None) -> tuple[Dataset, Dataset, int]:
    """A pack's train and val splits; without a val split, data.val_fraction of train."""
    packed = node_local_pack(Pack(data.path), data.images.cache, scratch)
    train = packed.split("train")
    make = lambda split, rows, is_train: ShardDataset(split, rows, is_train, data.augment, seed,
                                                      data.images.val_resize_ratio,
                                                      encoded=data.images.decode == "gpu")
    if "val" in packed.splits:
        return (make(train, None, True), make(packed.split("val"), None, False),
                len(packed.classes))
    if data.val_fraction is None:
        raise DataError(f"data.path: pack {packed.root} has no val split; set "
                        "data.val_fraction=0.1 to hold out part of train, or pack a source "
                        "with train/ and val/")
    train_rows, val_rows = hold_out(list(range(len(train.index))), data.val_fraction, seed)
    return (make(train, np.array(train_rows), True), make(train, np.array(val_rows), False),
            len(packed.classes))
