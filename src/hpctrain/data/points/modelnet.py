"""ModelNet10/40 in its two common layouts, read into point-cloud arrays.

- Mesh folders, as Princeton distributes them: `ROOT/<class>/{train,test}/*.off`. Each mesh
  is sampled to N points on its faces (by area) once, and the arrays are kept in the cache, so
  the 12,311 meshes of ModelNet40 are parsed on the first run only.
- The HDF5 files of the PointNet repository (`modelnet40_ply_hdf5_2048`): `*train*.h5` and
  `*test*.h5`, each with `data` (clouds, 2048, 3) and `label`, and `shape_names.txt`. Read with
  h5py (`pip install "hpctrain[points]"`).
The test split serves as validation. A file that cannot be read, has the wrong shape or holds
coordinates that are not finite is a DataError naming it: a training run never starts on a
cloud that would turn the loss into NaN.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpctrain.data.generated import generate_once
from hpctrain.data.points.clouds import check_clouds, fan, normalise, sample_on_faces
from hpctrain.errors import DataError
from hpctrain.progress_bar import progress_bar
from hpctrain.readers import MiB, read_data

SPLITS = {"train": "train", "val": "test"}  # our split -> ModelNet's folder and file names
FORMAT_VERSION = 1
PARALLEL_FROM = 200  # meshes; below this, starting worker processes costs more than it saves
MESH_CAP = 1 << 30  # one OFF mesh (ModelNet's largest are some tens of MB)


@dataclass
class PointSplits:
    """Both splits as arrays, and the class names."""

    classes: list[str]
    points: dict[str, np.ndarray]  # split -> (clouds, points, 3) float32
    labels: dict[str, np.ndarray]  # split -> (clouds,) int64


def layout(root: Path) -> str:
    """'hdf5' or 'off', from what the folder holds; a DataError when it is neither."""
    if not root.is_dir():
        raise DataError(f"data.path: {root} is not a folder")
    if any(root.glob("*.h5")):
        return "hdf5"
    if any(any(root.glob(f"*/{folder}/*.off")) for folder in SPLITS.values()):
        return "off"
    raise DataError(f"data.path: {root} holds neither ModelNet's mesh folders "
                    "(<class>/train/*.off and <class>/test/*.off) nor its HDF5 files "
                    "(ply_data_train*.h5, ply_data_test*.h5 and shape_names.txt)")


def classes(root: Path) -> list[str]:
    """The class names, without reading a cloud."""
    if layout(root) == "hdf5":
        return _shape_names(root)
    return _class_folders(root)


def _shape_names(root: Path) -> list[str]:
    names_file = root / "shape_names.txt"
    if not names_file.is_file():
        raise DataError(f"data.path: {root} has HDF5 files but no shape_names.txt (the class "
                        "names, one per line, as in modelnet40_ply_hdf5_2048)")
    try:
        text = read_data(names_file, MiB).decode(errors="replace")
    except (OSError, ValueError) as err:
        raise DataError(f"{names_file}: cannot be read ({err})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _class_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and any((p / f).is_dir() for f in SPLITS.values()))


def read_modelnet(root: Path, num_points: int, cache_dir: Path) -> PointSplits:
    root = Path(root).expanduser()
    if layout(root) == "hdf5":
        return read_hdf5(root, num_points)
    return read_off_folders(root, num_points, cache_dir)


# ---- HDF5 (PointNet's files) ----------------------------------------------------------------

def read_hdf5(root: Path, num_points: int) -> PointSplits:
    try:
        import h5py
    except ImportError:
        raise DataError(f"data.path: {root} holds HDF5 files, which need h5py: "
                        'pip install "hpctrain[points]"') from None
    names = _shape_names(root)
    points, labels = {}, {}
    for split, name in SPLITS.items():
        files = sorted(root.glob(f"*{name}*.h5"))
        if not files:
            raise DataError(f"data.path: {root} has no *{name}*.h5 file for the {split} split")
        parts = [_read_h5_file(h5py, path, num_points, len(names)) for path in files]
        points[split] = np.concatenate([p for p, _ in parts])
        labels[split] = np.concatenate([lab for _, lab in parts])
    return PointSplits(names, points, labels)


def _read_h5_file(h5py, path: Path, num_points: int, num_classes: int):
    try:
        with h5py.File(path, "r") as f:
            if "data" not in f or "label" not in f:
                raise DataError(f"{path}: an HDF5 file of ModelNet holds the datasets 'data' "
                                f"and 'label'; this one holds {sorted(f.keys())}")
            points = np.asarray(f["data"], dtype=np.float32)
            labels = np.asarray(f["label"]).reshape(-1).astype(np.int64)
    except OSError as err:
        raise DataError(f"{path}: not a readable HDF5 file ({err})") from None
    check_clouds(points, f"{path} (dataset 'data')", num_points)
    if len(labels) != len(points):
        raise DataError(f"{path}: {len(points)} clouds but {len(labels)} labels")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{path}: label {labels.max()} is outside the {num_classes} classes "
                        "of shape_names.txt")
    return normalise(points), labels


# ---- .off mesh folders ----------------------------------------------------------------------

def read_off(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(vertices, triangles) of an OFF file; faces with more corners are fanned. Accepts
    ModelNet's known defect of a header fused with the counts ('OFF490 518 0')."""
    try:
        tokens = read_data(path, MESH_CAP).decode("ascii", errors="strict").split()
    except (OSError, ValueError) as err:  # not ASCII (UnicodeDecodeError), past its cap
        raise DataError(f"{path}: cannot be read as an OFF file ({err})") from None
    if not tokens or not tokens[0].startswith("OFF"):
        raise DataError(f"{path}: not an OFF file (it must begin with 'OFF')")
    if tokens[0] != "OFF":
        tokens = ["OFF", tokens[0][3:], *tokens[1:]]
    try:
        n_vertices, n_faces = int(tokens[1]), int(tokens[2])
        start = 4
        vertices = np.array(tokens[start:start + 3 * n_vertices], dtype=np.float64)
        vertices = vertices.reshape(n_vertices, 3)
        polygons, at = [], start + 3 * n_vertices
        for _ in range(n_faces):
            corners = int(tokens[at])
            polygons.append([int(t) for t in tokens[at + 1:at + 1 + corners]])
            if len(polygons[-1]) != corners:
                raise ValueError("a face is cut off")
            at += 1 + corners
    except (ValueError, IndexError) as err:
        raise DataError(f"{path}: the OFF file is malformed ({err}); its counts, vertices or "
                        "faces do not add up") from None
    faces = np.array(fan(polygons), dtype=np.int64).reshape(-1, 3)
    if not np.isfinite(vertices).all():
        raise DataError(f"{path}: vertex coordinates that are not finite (NaN or inf)")
    if len(faces) == 0 or faces.min() < 0 or faces.max() >= n_vertices:
        raise DataError(f"{path}: the faces name vertices the file does not have "
                        f"({n_vertices} vertices)")
    return vertices, faces


def _sample_mesh(job: tuple) -> np.ndarray:
    path, num_points, seed = job
    vertices, faces = read_off(Path(path))
    try:
        points = sample_on_faces(vertices, faces, num_points, np.random.default_rng(seed))
    except ValueError as err:
        raise DataError(f"{path}: {err}") from None
    return normalise(points)


def _meshes(root: Path) -> tuple[list[str], dict[str, list[tuple[Path, int]]]]:
    names = _class_folders(root)
    files = {split: [(path, label) for label, name in enumerate(names)
                     for path in sorted((root / name / folder).glob("*.off"))]
             for split, folder in SPLITS.items()}
    for split, found in files.items():
        if not found:
            raise DataError(f"data.path: {root} has no <class>/{SPLITS[split]}/*.off meshes "
                            f"for the {split} split")
    return names, files


def read_off_folders(root: Path, num_points: int, cache_dir: Path) -> PointSplits:
    """The meshes sampled to clouds, from the cache when this listing was sampled before."""
    names, files = _meshes(root)
    listing = hashlib.sha256(json.dumps(
        [FORMAT_VERSION, str(root.resolve()), num_points,
         [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for found in files.values()
          for p, _ in found]]).encode()).hexdigest()[:16]
    folder = generate_once(Path(cache_dir).expanduser() / f"modelnet-off-{listing}",
                           lambda tmp: _sample_folders(files, num_points, tmp))
    return PointSplits(names,
                       {s: np.load(folder / f"{s}_points.npy", mmap_mode="r") for s in SPLITS},
                       {s: np.load(folder / f"{s}_labels.npy") for s in SPLITS})


def _sample_folders(files: dict, num_points: int, out: Path) -> dict:
    """Every split's meshes sampled into `out` (with one pool of processes for all, when
    there are enough meshes to pay for starting it)."""
    total = sum(len(found) for found in files.values())
    with contextlib.ExitStack() as stack, \
            progress_bar("sampling the ModelNet meshes", total=total) as advance:
        pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(
            os.cpu_count() or 1)) if total >= PARALLEL_FROM else None
        for split, found in files.items():
            jobs = [(str(path), num_points, index) for index, (path, _) in enumerate(found)]
            clouds = []
            for cloud in (pool.imap(_sample_mesh, jobs, chunksize=16) if pool else
                          map(_sample_mesh, jobs)):
                clouds.append(cloud)
                advance(1)
            np.save(out / f"{split}_points.npy", np.stack(clouds))
            np.save(out / f"{split}_labels.npy", np.array([lab for _, lab in found]))
    return {"meshes": total}
