"""Packed shards: a dataset as a few large tar files plus an index, read with random access.

Why: a parallel file system serves a few large files at full bandwidth but millions of small
JPEG opens slowly, and a sequential tar stream (WebDataset) can only shuffle within a buffer.
Here the tar files are standard (readable by `tar` and by WebDataset: members `00000042.jpg`
and `00000042.cls`), and a sidecar index gives every sample's shard, byte offset, size, CRC-32,
label and image size, so a DataLoader worker memory-maps the shards and reads any sample
directly: a true global shuffle every epoch, distributed sharding without duplicates, and no
per-worker copy of the data.

Layout of a pack folder:
    pack.json                the manifest: classes, options, per split its shards (samples,
                             bytes, SHA-256) and its index file's SHA-256
    train-00000.tar ...      the shards of a split
    train.index.npy          one INDEX_DTYPE record per sample, in the order of the shards
    val-00000.tar, val.index.npy   when the source had a validation split

Integrity: opening a pack checks the manifest's shape, each index's SHA-256 (an index copied
from another pack fails here), each shard's size (a truncated shard fails here) and every index
record (its shard, byte range, label and image size); every sample read is checked against its
CRC-32, so a corrupted or shifted byte range is named in an error, never decoded into a wrong
image. Full shard SHA-256 checks happen when shards are copied to a node-local cache
(node_cache.py).

A pack may come from elsewhere: every name the manifest gives is a plain file name of the
pack folder and the pack id is a hex string (it names the node-local cache folder), so no
manifest can make hpctrain read, write or delete a file outside the pack or its cache.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import Field, StringConstraints, ValidationError

from hpctrain.data.packs import (MANIFEST, Count, FileName, IndexEntry, Sha256, StrictModel, beyond,
                                  file_sha256, manifest_json, pack_file)
from hpctrain.errors import DataError

FORMAT = "hpctrain-shards"
VERSION = 1
KIND_JPEG, KIND_RAW = 0, 1  # raw: binary PPM (P6), RGB pixels after a short header
EXTENSIONS = {KIND_JPEG: "jpg", KIND_RAW: "ppm"}
MAX_SIDE = 65535  # an index records image sides in 16 bits
MAX_PIXELS = 2 * 89_478_485  # twice PIL's decompression-bomb warning: PIL refuses beyond
MAX_CLASSES = 1_000_000
INDEX_DTYPE = np.dtype([("shard", "<u4"), ("offset", "<u8"), ("size", "<u4"), ("crc32", "<u4"),
                        ("label", "<i4"), ("width", "<u2"), ("height", "<u2"), ("kind", "u1")])


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:05d}.tar"


def ppm_header(width: int, height: int) -> bytes:
    return f"P6\n{width} {height}\n255\n".encode()


def raw_pixels(data, width: int, height: int) -> np.ndarray:
    """The HWC uint8 view of a raw (PPM) sample's pixels, without copying."""
    return np.frombuffer(data, np.uint8, offset=len(ppm_header(width, height))).reshape(
        height, width, 3)


# --- the manifest's shape: plain names only --------------------------------------------------


class ShardEntry(StrictModel):
    file: FileName
    samples: Count
    bytes: Count
    sha256: Sha256


class SplitEntry(StrictModel):
    samples: Count
    index: IndexEntry
    shards: list[ShardEntry]


class Manifest(StrictModel):
    format: str
    version: int
    pack_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    classes: Annotated[list[str], Field(min_length=1, max_length=MAX_CLASSES)]
    splits: dict[FileName, SplitEntry]


def _read_manifest(path: Path) -> Manifest:
    data = manifest_json(path, "re-run hpctrain pack with --overwrite")
    if not isinstance(data, dict) or data.get("format") != FORMAT or \
            data.get("version") != VERSION:
        found = (data.get("format"), data.get("version")) if isinstance(data, dict) else \
            type(data).__name__
        raise DataError(f"{path}: not a {FORMAT} version {VERSION} manifest (found {found}); "
                        "re-pack with this version of hpctrain")
    try:
        return Manifest.model_validate(data)
    except ValidationError as err:
        problem = err.errors()[0]
        where = ".".join(str(p) for p in problem["loc"]) or "(top)"
        raise DataError(f"{path}: {where}: {problem['msg']} (a pack's manifest names only "
                        "plain files of its folder); re-pack the source with hpctrain "
                        "pack") from None


def _check_records(index: np.ndarray, shards: list[ShardEntry], classes: int,
                   name: str) -> None:
    """Every record names a shard of the split, a byte range inside it, a known label and an
    image size a decoder may be asked for; raw samples hold exactly their pixels."""
    if len(index) and not shards:
        raise DataError(f"{name}: {len(index)} records but no shard; re-pack the source")
    sizes = np.array([s.bytes for s in shards] or [0], dtype=np.uint64)
    shard = index["shard"].astype(np.int64)
    width, height = index["width"].astype(np.int64), index["height"].astype(np.int64)
    digits = lambda v: np.floor(np.log10(np.maximum(v, 1))).astype(np.int64) + 1  # noqa: E731
    raw_size = 9 + digits(width) + digits(height) + width * height * 3
    problems = [
        (shard >= len(shards), lambda i: f"names shard {shard[i]}, the split has "
                                         f"{len(shards)}"),
        ((shard < len(shards)) & beyond(index["offset"], index["size"],
                                        sizes[np.minimum(shard, len(shards) - 1)]),
         lambda i: f"holds bytes {index['offset'][i]} to "
                   f"{int(index['offset'][i]) + int(index['size'][i])}, beyond the end of "
                   "its shard"),
        ((index["label"] < 0) | (index["label"] >= classes),
         lambda i: f"has label {index['label'][i]}, the pack has {classes} classes"),
        ((width < 1) | (height < 1) | (width * height > MAX_PIXELS),
         lambda i: f"has an image of {width[i]} x {height[i]} pixels"),
        (index["kind"] > KIND_RAW, lambda i: f"has unknown kind {index['kind'][i]}"),
        ((index["kind"] == KIND_RAW) & (index["size"] != raw_size),
         lambda i: f"is a raw {width[i]} x {height[i]} image of {index['size'][i]} bytes"),
    ]
    for bad, say in problems:
        if bad.any():
            first = int(np.argmax(bad))
            raise DataError(f"{name}: record {first} {say(first)}; the index does not "
                            "describe this pack. Re-pack the source with hpctrain pack")


@dataclass
class Split:
    name: str
    index: np.ndarray  # INDEX_DTYPE records, memory-mapped
    shards: list[Path]


class Pack:
    """An opened, checked pack folder."""

    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser()
        manifest = self.root / MANIFEST
        if not manifest.is_file():
            hint = (" (an unfinished pack: run hpctrain pack again to finish it)"
                    if any(self.root.glob(".*.partial")) or (self.root / ".plan.json").exists()
                    else "; create one with: hpctrain pack SRC DST")
            raise DataError(f"data.path: {self.root} is not a packed dataset, it has no "
                            f"{MANIFEST}{hint}")
        self.manifest = _read_manifest(manifest)
        self.classes: list[str] = self.manifest.classes
        self.pack_id: str = self.manifest.pack_id

    @property
    def splits(self) -> list[str]:
        return list(self.manifest.splits)

    def split(self, name: str) -> Split:
        """The split's index and shards, after the cheap checks (index checksum, shard sizes)."""
        entry = self.manifest.splits.get(name)
        if entry is None:
            raise DataError(f"pack {self.root} has no '{name}' split (it has "
                            f"{', '.join(self.splits)})")
        index_path = pack_file(self.root, entry.index.file)
        if not index_path.is_file():
            raise DataError(f"pack {self.root}: index {index_path.name} is missing; re-run "
                            "hpctrain pack")
        if file_sha256(index_path) != entry.index.sha256:
            raise DataError(f"pack {self.root}: {index_path.name} does not belong to this pack "
                            f"(its SHA-256 differs from {MANIFEST}'s): was it copied from "
                            "another pack? Re-pack, or restore the matching index")
        try:
            index = np.load(index_path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as err:
            raise DataError(f"pack {self.root}: {index_path.name} is not an index ({err}); "
                            "re-pack") from None
        if index.dtype != INDEX_DTYPE or index.ndim != 1 or len(index) != entry.samples:
            raise DataError(f"pack {self.root}: {index_path.name} has {len(index)} records of "
                            f"type {index.dtype}, the manifest expects {entry.samples}")
        shards = []
        for shard in entry.shards:
            path = pack_file(self.root, shard.file)
            if not path.is_file():
                raise DataError(f"pack {self.root}: shard {shard.file} is missing "
                                f"({len(entry.shards)} shards expected); restore it or "
                                "re-run hpctrain pack")
            size = path.stat().st_size
            if size != shard.bytes:
                raise DataError(f"pack {self.root}: shard {shard.file} has {size} bytes, "
                                f"the manifest says {shard.bytes}: it is truncated or was "
                                "changed; restore it or re-pack")
            shards.append(path)
        _check_records(index, entry.shards, len(self.classes), f"pack {self.root}: "
                       f"{index_path.name}")
        return Split(name, index, shards)


class ShardReader:
    """Byte ranges of samples, from memory maps opened lazily in the process that reads (so a
    DataLoader worker maps the shards itself; nothing is copied when workers start)."""

    def __init__(self, shards: list[Path]):
        self.shards = [str(s) for s in shards]
        self._maps: dict[int, np.memmap] = {}

    def __getstate__(self):
        return {"shards": self.shards, "_maps": {}}

    def read(self, record) -> memoryview:
        shard = int(record["shard"])
        mapped = self._maps.get(shard)
        if mapped is None:
            mapped = self._maps[shard] = np.memmap(self.shards[shard], dtype=np.uint8, mode="r")
        start = int(record["offset"])
        data = memoryview(mapped[start:start + int(record["size"])])
        if len(data) != int(record["size"]) or zlib.crc32(data) != int(record["crc32"]):
            raise DataError(f"shard {self.shards[shard]} is corrupted: the sample at byte "
                            f"{start} ({int(record['size'])} bytes) fails its CRC-32 check. "
                            "Restore the shard or re-pack")
        return data
