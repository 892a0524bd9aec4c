"""Point clouds: sampling points on a mesh, the checks every cloud passes, and the Dataset.

Clouds are held as one float32 array (clouds, points, 3) and labels beside it, whatever the
source (the built-in shapes3d, ModelNet's mesh folders or its HDF5 files), so a sample is one
slice: no decoding, no per-sample file. Each cloud is centred on its centroid and scaled into
the unit sphere, as PointNet's data is, so the same model sees the same scale from any source.
"""

from __future__ import annotations


import numpy as np
import torch
from torch.utils.data import Dataset

from hpctrain.errors import DataError


def fan(polygons) -> list[tuple[int, int, int]]:
    """Convex polygons (corner indices) as triangles sharing each polygon's first corner."""
    return [(face[0], face[i], face[i + 1]) for face in polygons
            for i in range(1, len(face) - 1)]


def sample_on_faces(vertices: np.ndarray, faces: np.ndarray, count: int,
                    rng: np.random.Generator) -> np.ndarray:
    """`count` points uniformly on the surface of a triangle mesh: a face drawn with
    probability proportional to its area, then a uniform point inside it."""
    a, b, c = (vertices[faces[:, i]] for i in range(3))
    areas = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    total = areas.sum()
    if not np.isfinite(total) or total <= 0:
        raise ValueError("the mesh has no surface (every face has zero area)")
    chosen = rng.choice(len(faces), size=count, p=areas / total)
    r1, r2 = rng.random((2, count, 1))
    root = np.sqrt(r1)  # uniform over the triangle, not crowded at a corner
    points = (1 - root) * a[chosen] + root * (1 - r2) * b[chosen] + root * r2 * c[chosen]
    return points.astype(np.float32)


def normalise(points: np.ndarray) -> np.ndarray:
    """Centred on the centroid, the farthest point at distance 1 (each cloud of a batch)."""
    centred = points - points.mean(axis=-2, keepdims=True)
    radius = np.linalg.norm(centred, axis=-1).max(axis=-1)[..., None, None]
    return (centred / np.maximum(radius, 1e-12)).astype(np.float32)


def check_clouds(points: np.ndarray, where: str, num_points: int | None = None) -> None:
    """A DataError naming `where` for an array that is not (clouds, points, 3) or holds a
    coordinate that is not finite (NaN or inf would reach the loss and stop the run later)."""
    if points.ndim != 3 or points.shape[-1] != 3:
        raise DataError(f"{where}: point clouds must have the shape (clouds, points, 3), got "
                        f"{tuple(points.shape)}")
    if num_points is not None and points.shape[1] < num_points:
        raise DataError(f"{where}: clouds of {points.shape[1]} points, fewer than "
                        f"data.points.num_points={num_points}; lower it")
    finite = np.isfinite(points).all(axis=(1, 2))
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise DataError(f"{where}: {len(bad)} cloud(s) hold coordinates that are not finite "
                        f"(NaN or inf), the first at index {bad[0]}; remove or repair them")


class PointClouds(Dataset):
    """(points, label) samples: the first `num_points` points of each stored cloud, as float32
    (num_points, 3). Sources that store more points (ModelNet's HDF5 has 2,048) keep their
    order, as PointNet's training does; the random subset comes from the task's dropout."""

    def __init__(self, points: np.ndarray, labels: np.ndarray, num_points: int):
        self.points, self.labels, self.num_points = points, labels.astype(np.int64), num_points

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, key):
        index = int(key[0] if isinstance(key, tuple) else key)  # a SampleKey or an index
        return (torch.from_numpy(np.array(self.points[index, :self.num_points])),  # a copy:
                # the stored clouds are memory-mapped read-only
                int(self.labels[index]))
