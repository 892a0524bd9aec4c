"""The built-in point clouds (shapes3d, made on first use) and ModelNet's, as datasets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from hpctrain.data.points.clouds import PointClouds
from hpctrain.data.points.modelnet import PointSplits, read_modelnet
from hpctrain.data.points.modelnet import classes as modelnet_classes
from hpctrain.data.points.modelnet import layout as modelnet_layout
from hpctrain.data.points.shapes3d import CLASSES as SHAPES3D_CLASSES
from hpctrain.data.points.shapes3d import ensure_shapes3d
from hpctrain.data.splits import check_classes
from hpctrain.errors import DataError


def point_splits(data) -> PointSplits:
    """The clouds of the built-in shapes3d (made on first use) or of ModelNet at data.path."""
    if data.dataset == "shapes3d":
        s = data.shapes3d
        folder = ensure_shapes3d(Path(s.cache_dir).expanduser(), s.seed, s.num_train,
                                 s.num_val, data.points.num_points)
        return PointSplits(list(SHAPES3D_CLASSES),
                           *({split: np.load(folder / f"{split}_{what}.npy", mmap_mode="r")
                              for split in ("train", "val")} for what in ("points", "labels")))
    return read_modelnet(Path(data.path), data.points.num_points,
                         Path(data.points.cache_dir).expanduser())


def point_classes(data) -> int:
    """The number of classes of point-cloud data, without reading the clouds."""
    if data.dataset == "shapes3d":
        return len(SHAPES3D_CLASSES)
    return len(modelnet_classes(Path(data.path).expanduser()))


def point_datasets(data) -> tuple[Dataset, Dataset, int]:
    """The clouds were checked where they were read or made (points/modelnet.py,
    points/shapes3d.py)."""
    splits = point_splits(data)
    for split, points in splits.points.items():
        if len(points) == 0:
            raise DataError(f"data.path: {data.path} has no clouds in its {split} split")
    make = lambda split: PointClouds(splits.points[split], splits.labels[split],
                                     data.points.num_points)
    return check_classes(data, make("train"), make("val"), len(splits.classes))


def up_axis(data) -> int:
    """The index of the axis that point clouds turn about: ModelNet's HDF5 files (PointNet's
    convention) have y up, the meshes and shapes3d z."""
    axis = data.points.up_axis
    if axis == "auto":
        hdf5 = data.dataset == "modelnet" and modelnet_layout(Path(data.path).expanduser()) \
            == "hdf5"
        axis = "y" if hdf5 else "z"
    return "xyz".index(axis)
