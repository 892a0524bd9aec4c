"""The built-in `shapes3d` dataset: point clouds sampled from the surfaces of 3D primitives.

`shapes` does for images what this does for point clouds: a real classification task that
downloads nothing and trains in minutes on a laptop. Ten kinds of primitive, each a triangle
mesh with random proportions (a cylinder's height, a torus's tube, ...), sampled uniformly on
its surface, then stretched along random axes, rotated at random, noised and normalised into
the unit sphere. Every cloud is a pure function of (seed, split, index), so the set is
identical everywhere; it is generated once into the cache as two .npy arrays per split.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hpctrain.data.generated import generate_once
from hpctrain.data.points.clouds import fan, normalise, sample_on_faces
from hpctrain.progress_bar import progress_bar

CLASSES = ("sphere", "hemisphere", "capsule", "cylinder", "cone", "torus",
           "cube", "pyramid", "octahedron", "prism")
FORMAT_VERSION = 1
SEGMENTS = 24  # around the axis of a surface of revolution


def lathe(profile: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The surface swept by turning a (radius, height) polyline about the z axis."""
    angles = np.linspace(0, 2 * math.pi, SEGMENTS, endpoint=False)
    r, z = np.array(profile, dtype=np.float64).T
    vertices = np.stack([np.outer(r, np.cos(angles)), np.outer(r, np.sin(angles)),
                         np.repeat(z[:, None], SEGMENTS, axis=1)], axis=-1).reshape(-1, 3)
    faces = []
    for i in range(len(profile) - 1):
        for j in range(SEGMENTS):
            a, b = i * SEGMENTS + j, i * SEGMENTS + (j + 1) % SEGMENTS
            faces += [(a, b, b + SEGMENTS), (a, b + SEGMENTS, a + SEGMENTS)]
    return vertices, np.array(faces)


def _arc(radius: float, start: float, stop: float, centre: float = 0.0, steps: int = 12):
    """(radius, height) points of a circular arc about (0, centre), angles from the +z axis."""
    return [(radius * math.sin(t), centre + radius * math.cos(t))
            for t in np.linspace(start, stop, steps)]


def _polyhedron(vertices, polygons) -> tuple[np.ndarray, np.ndarray]:
    """A mesh from corners and faces given as corner indices."""
    return np.array(vertices, dtype=np.float64), np.array(fan(polygons))


CUBE = [(x, y, z) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]  # corner i: bits x y z
CUBE_FACES = [(0, 1, 3, 2), (4, 5, 7, 6), (0, 1, 5, 4), (2, 3, 7, 6), (0, 2, 6, 4), (1, 3, 7, 5)]
OCTAHEDRON_FACES = [(x, y, z) for x in (0, 1) for y in (2, 3) for z in (4, 5)]


def primitive(name: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A mesh of kind `name` with random proportions."""
    if name == "sphere":
        return lathe(_arc(1.0, 0, math.pi, steps=16))
    if name == "hemisphere":
        return lathe([(0.0, 0.0), *_arc(1.0, math.pi / 2, 0, steps=10)])
    if name == "capsule":
        half = rng.uniform(0.8, 1.6)
        return lathe(_arc(0.6, 0, math.pi / 2, half, 8) + _arc(0.6, math.pi / 2, math.pi,
                                                                  -half, 8))
    if name == "cylinder":
        h = rng.uniform(0.6, 2.0)
        return lathe([(0, h), (1, h), (1, -h), (0, -h)])
    if name == "cone":
        h = rng.uniform(0.8, 2.0)
        return lathe([(0, h), (1, -h), (0, -h)])
    if name == "torus":
        tube = rng.uniform(0.2, 0.45)
        return lathe([(1 + tube * math.sin(t), tube * math.cos(t))
                      for t in np.linspace(0, 2 * math.pi, 13)])
    if name == "cube":
        return _polyhedron(CUBE, CUBE_FACES)
    if name == "pyramid":
        h = rng.uniform(1.0, 2.0)
        return _polyhedron([(-1, -1, 0), (1, -1, 0), (1, 1, 0), (-1, 1, 0), (0, 0, h)],
                           [(0, 1, 2, 3), (0, 1, 4), (1, 2, 4), (2, 3, 4), (3, 0, 4)])
    if name == "octahedron":
        return _polyhedron([(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)],
                           OCTAHEDRON_FACES)
    if name == "prism":
        h = rng.uniform(0.6, 2.0)
        corners = [(math.cos(a), math.sin(a)) for a in (0, 2 * math.pi / 3, 4 * math.pi / 3)]
        return _polyhedron([(x, y, z) for z in (-h, h) for x, y in corners],
                           [(0, 1, 2), (3, 4, 5), (0, 1, 4, 3), (1, 2, 5, 4), (2, 0, 3, 5)])
    raise ValueError(f"unknown primitive {name!r}")


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """A rotation drawn uniformly from all rotations (the Q of a Gaussian matrix's QR)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def render(seed: int, split: str, index: int, num_points: int) -> tuple[np.ndarray, int]:
    """Cloud `index` of `split`; the label cycles through the classes."""
    label = index % len(CLASSES)
    rng = np.random.default_rng([seed, {"train": 0, "val": 1}[split], index])
    vertices, faces = primitive(CLASSES[label], rng)
    points = sample_on_faces(vertices, faces, num_points, rng).astype(np.float64)
    points *= rng.uniform(0.8, 1.25, 3)  # stretched along the axes, then turned any way
    points = points @ random_rotation(rng).T
    points += rng.normal(0, rng.uniform(0, 0.02), points.shape)
    return normalise(points), label


def ensure_shapes3d(root: Path, seed: int, num_train: int, num_val: int,
                    num_points: int) -> Path:
    """Generate the dataset under `root` once (generated.py) and return its folder:
    train_points.npy, train_labels.npy, val_points.npy, val_labels.npy."""
    folder = Path(root) / (f"shapes3d-v{FORMAT_VERSION}-s{seed}-n{num_train}-{num_val}"
                           f"-p{num_points}")

    def make(tmp: Path) -> dict:
        with progress_bar("generating the shapes3d dataset",
                          total=num_train + num_val) as advance:
            for split, count in (("train", num_train), ("val", num_val)):
                points = np.empty((count, num_points, 3), dtype=np.float32)
                labels = np.empty(count, dtype=np.int64)
                for i in range(count):
                    points[i], labels[i] = render(seed, split, i, num_points)
                    if i % 500 == 499 or i == count - 1:
                        advance(i % 500 + 1)
                np.save(tmp / f"{split}_points.npy", points)
                np.save(tmp / f"{split}_labels.npy", labels)
        return {"classes": CLASSES, "seed": seed}

    return generate_once(folder, make)
