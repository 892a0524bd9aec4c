"""What the packs share, whatever they carry (images/image_pack.py, tokens/token_pack.py):
the manifest's name and plain-name rules, the index file's name, checksums, the checks that
keep a crafted pack inside its folder and its ranges inside its files, and the writing side
(atomic index files, hashing while writing, resumable destinations, worker processes).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from hpctrain.errors import DataError
from hpctrain.readers import MiB, json_document, json_mapping
from hpctrain.writers import fresh_file, replacing, write_whole


# --- reading: names, checksums, bounds --------------------------------------------------------

MANIFEST = "pack.json"


MANIFEST_CAP = 256 * MiB  # a pack's manifest: its shards and every file it skipped


def manifest_json(path: Path, fix: str):
    """The JSON value of a pack's manifest, read through readers.py (a regular file, not a
    link, of at most MANIFEST_CAP bytes, nested at most 64 levels); DataError naming why it
    cannot be, then `fix`."""
    value, why = json_document(path, MANIFEST_CAP)
    if why is None and value is None:
        why = "is missing"
    if why is not None:
        raise DataError(f"{path} {why}; {fix}")
    return value


def index_name(split: str) -> str:
    return f"{split}.index.npy"


def file_sha256(path: Path, chunk: int = 8 << 20, advance=None) -> str:
    """The file's SHA-256; `advance(bytes)` after each chunk read (a progress bar)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
            if advance is not None:
                advance(len(block))
    return digest.hexdigest()


FileName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}$")]


Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


Count = Annotated[int, Field(ge=0)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class IndexEntry(StrictModel):
    file: FileName
    sha256: Sha256


def links_out(root: Path, name: str) -> bool:
    """Whether the file `name` of the pack folder `root` is a link leading out of the folder:
    a pack reads only its own files, not what a crafted pack points at (another user's data,
    /etc)."""
    path = root / name
    return path.is_symlink() and not path.resolve().is_relative_to(root.resolve())


def pack_file(root: Path, name: str) -> Path:
    """The file `name` (a plain name, checked with the manifest) of the pack folder `root`;
    refused where it links out of the folder."""
    path = root / name
    if links_out(root, name):
        raise DataError(f"pack {root}: {name} is a link to {os.readlink(path)}, outside the "
                        "pack; a pack reads only its own files: copy the file in, or pack "
                        "again")
    return path


def beyond(starts: np.ndarray, lengths: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """Where the range [start, start + length) does not lie within [0, limit), for unsigned
    index fields: the sum is never formed, since a crafted start near 2**64 wraps it around to
    a small end that passes (and the reader then allocates `length` items)."""
    starts, lengths = starts.astype(np.uint64), lengths.astype(np.uint64)
    limits = limits.astype(np.uint64)
    return (starts > limits) | (lengths > limits - np.minimum(starts, limits))


# --- writing ----------------------------------------------------------------------------------

PLAN = ".plan.json"
FRAGMENT_CAP = 256 * MiB  # a job's statistics: its skipped files' paths and reasons


def save_npy(path: Path, index: np.ndarray) -> None:
    """np.save into a fresh file, then renamed to `path` (writers.replacing)."""
    with replacing(path) as handle:
        np.save(handle, index, allow_pickle=False)


class HashingFile:
    """A shard being written: a fresh file beside `path` (writers.fresh_file: never through a
    link planted at a name) that hashes what goes into it, so that a shard's SHA-256 needs no
    second read (tarfile needs only write and tell); `keep()` renames it to `path`,
    `discard()` removes it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        descriptor, self.partial = fresh_file(self.path)
        self.file = os.fdopen(descriptor, "wb")
        self.digest = hashlib.sha256()
        self.size = 0

    def keep(self) -> None:
        self.file.close()
        os.replace(self.partial, self.path)

    def discard(self) -> None:
        self.file.close()
        self.partial.unlink(missing_ok=True)

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.file.write(data)

    def tell(self) -> int:
        return self.file.tell()


def _planned(plan: Path) -> str | None:
    """The fingerprint an unfinished pack was planned with (None: none, or unreadable)."""
    found = json_mapping(plan, FRAGMENT_CAP)
    return found.get("fingerprint") if found is not None else None


def read_fragment(path: Path) -> dict | None:
    """A finished job's statistics (a packing worker wrote them), None where they cannot be
    read: its job is done again."""
    return json_mapping(path, FRAGMENT_CAP)


def leftovers(dst: Path) -> list[Path]:
    """The partial files of writes a killed worker left (writers.fresh_file's names)."""
    return list(dst.glob(".*.partial*"))


def prepare_destination(dst: Path, fingerprint: str, overwrite: bool) -> bool:
    """Make `dst` ready; True when an unfinished pack of the same plan is resumed."""
    plan = dst / PLAN
    if dst.exists() and not dst.is_dir():
        raise DataError(f"pack: {dst} is a file; give a folder (empty, or an unfinished pack "
                        "to resume)")
    if dst.exists() and any(dst.iterdir()):
        resumable = _planned(plan) == fingerprint and not (dst / MANIFEST).exists()
        if resumable:
            return True
        if not overwrite:
            what = ("a finished pack" if (dst / MANIFEST).exists() else
                    "an unfinished pack of another source or other options"
                    if plan.is_file() else "other files")
            raise DataError(f"pack: {dst} is not empty (it holds {what}); choose an empty "
                            "folder, or add --overwrite to replace its contents")
        for entry in dst.iterdir():
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    dst.mkdir(parents=True, exist_ok=True)
    write_whole(plan, json.dumps({"fingerprint": fingerprint}))
    return False


def _signals_as_usual() -> None:
    """A packing worker takes every signal: the forkserver it comes from may have been started
    by a training run's loader with the stop signals blocked (worker_signals.py), which its
    children inherit, and a worker that cannot take SIGTERM hangs Pool.terminate for good."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def run_jobs(write, jobs: list, workers: int | None):
    """`write(job)` for every job, in up to `workers` processes (default: one per core) or in
    this one; the results as they finish."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    if workers == 1:
        yield from map(write, jobs)
        return
    pool = multiprocessing.get_context("forkserver").Pool(workers, initializer=_signals_as_usual)
    try:
        yield from pool.imap_unordered(write, jobs)
    finally:
        pool.terminate()
