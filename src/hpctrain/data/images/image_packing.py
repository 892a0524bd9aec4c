"""`hpctrain pack SRC DST`: turn an image dataset into packed shards (format: image_pack.py).

The work is planned first (which sample goes to which shard, in a seeded shuffled order so that
even a sequential reader of the tars sees mixed classes), then shards are written in parallel,
one process per shard. Each shard is written under a temporary name and renamed when complete,
with its index fragment and statistics beside it; a re-run with the same source and options
skips the finished shards, so an interrupted pack resumes. The manifest is written last:
a folder without pack.json is never mistaken for a usable pack.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import random
import stat
import tarfile
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from hpctrain.data.images.image_folders import image_folder_splits
from hpctrain.data.packs import (MANIFEST, PLAN, HashingFile, file_sha256, index_name,
                                  leftovers, prepare_destination, read_fragment, run_jobs,
                                  save_npy)
from hpctrain.data.images.image_pack import (EXTENSIONS, FORMAT, INDEX_DTYPE, KIND_JPEG,
                                             KIND_RAW, MAX_CLASSES, MAX_SIDE, VERSION,
                                             ppm_header, shard_name)
from hpctrain.errors import DataError
from hpctrain.progress_bar import progress_bar
from hpctrain.writers import write_whole

SHARD_SAMPLES = 16_384  # at most, per shard: 2 kB images made one shard of 100,000 (one worker)


@dataclass
class PackOptions:
    max_side: int | None = None  # pre-resize so that the longer side is at most this
    store: str = "jpeg"  # jpeg | raw | auto (raw when small, or drawn into raw_fraction)
    raw_max_side: int = 64
    raw_fraction: float = 0.0  # auto: also store this share of the larger images raw
    quality: int | None = None  # re-encode every JPEG at this quality; None: keep the bytes
    shard_bytes: int = 256 << 20
    seed: int = 0
    shuffle: bool = True  # False: sample i of the pack is sample i of the source


@dataclass
class ShardJob:
    split: str
    number: int
    first: int  # position of the shard's first sample in the split
    samples: list[tuple[str, int]]
    dst: str
    options: PackOptions
    strict: bool


@dataclass
class ShardResult:
    split: str
    number: int
    samples: int = 0
    bytes: int = 0
    sha256: str = ""
    per_class: dict[int, int] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)


# --- the source ------------------------------------------------------------------------------

def read_source(src: Path) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """(classes, {split: [(path, label)]}) of an ImageFolder tree (with train/ and val/, or one
    tree) or of a CSV/list file of `path,label` lines (paths relative to the file's folder;
    labels are class names or integers)."""
    if src.is_file():
        return _read_list(src)
    return image_folder_splits(src)


def _read_list(path: Path) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    rows = []
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            for number, row in enumerate(csv.reader(handle), 1):
                if not row or row[0].startswith("#"):
                    continue
                if len(row) != 2 or not row[0].strip():
                    raise DataError(f"{path}:{number}: expected 'path,label', got {row!r}")
                if number == 1 and row[1].strip().lower() == "label":
                    continue  # a header line
                rows.append((number, row[0].strip(), row[1].strip()))
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start} cannot be read: "
                        f"{err.reason}); save the list as UTF-8") from None
    except csv.Error as err:
        raise DataError(f"{path}: not a CSV list of 'path,label' lines ({err})") from None
    if not rows:
        raise DataError(f"{path}: no 'path,label' lines")
    if all(label.lstrip("-").isdigit() for _, _, label in rows):
        labelled = [(number, p, int(label)) for number, p, label in rows]
        for number, _, label in labelled:
            if not 0 <= label < MAX_CLASSES:
                raise DataError(f"{path}:{number}: label {label} is not a class number from 0 "
                                f"to {MAX_CLASSES - 1}; renumber the classes from 0, or give "
                                "class names instead")
        classes = [str(i) for i in range(max(label for _, _, label in labelled) + 1)]
    else:
        classes = sorted({label for _, _, label in rows})
        if len(classes) > MAX_CLASSES:
            raise DataError(f"{path}: {len(classes)} class names, more than {MAX_CLASSES}")
        lookup = {name: i for i, name in enumerate(classes)}
        labelled = [(number, p, lookup[label]) for number, p, label in rows]
    base = path.parent
    return classes, {"train": [(str(base / p) if not os.path.isabs(p) else p, label)
                               for _, p, label in labelled]}


def plan_shards(splits: dict[str, list[tuple[str, int]]], dst: Path, options: PackOptions,
                strict: bool) -> list[ShardJob]:
    """Shuffle each split once (seeded; a sequential reader of the tars then sees mixed
    classes) and cut it into shards of about options.shard_bytes, estimated from the source
    files' sizes, and of at most SHARD_SAMPLES (so that small files too make a shard for
    every packing worker)."""
    jobs = []
    for split, samples in splits.items():
        order = list(samples)
        if options.shuffle:
            random.Random(f"{options.seed}-{split}").shuffle(order)
        groups, current, size = [], [], 0
        for sample in order:
            current.append(sample)
            size += _estimated_bytes(sample[0], options)
            if size >= options.shard_bytes or len(current) == SHARD_SAMPLES:
                groups.append(current)
                current, size = [], 0
        groups += [current] if current else []
        first = 0
        for number, group in enumerate(groups):
            jobs.append(ShardJob(split, number, first, group, str(dst), options, strict))
            first += len(group)
    return jobs


def _estimated_bytes(path: str, options: PackOptions) -> int:
    try:
        size = os.stat(path).st_size
    except (OSError, ValueError):  # missing, unreadable, or no path at all (a NUL byte)
        return 0
    return size if options.max_side is None else min(size, options.max_side ** 2 // 2)


# --- one shard -------------------------------------------------------------------------------

def encode_sample(path: str, options: PackOptions) -> tuple[bytes, int, int, int]:
    """(bytes, kind, width, height) of one source image, as the options want it stored.
    Original JPEG bytes are kept when nothing needs to change; only regular files are read (a
    FIFO would block, /dev/zero never end). Every image is decoded, so that a truncated file
    fails here, not in training; one kept as it is decodes at an eighth of its size (JPEG's DCT
    scaling: every coded block is still read, 5x faster than a full decode)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    with open(path, "rb") as handle:
        raw = handle.read()
    with Image.open(io.BytesIO(raw)) as image:
        width, height = image.size
        stored = _stored_size(width, height, options)
        as_raw = _stored_raw(path, *stored, options)
        if (image.format == "JPEG" and image.mode == "RGB" and options.quality is None
                and stored == (width, height) and not as_raw):
            image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
            image.load()
            return raw, KIND_JPEG, width, height
        image.load()
        image = image.convert("RGB")
    if stored != (width, height):
        image = image.resize(stored, Image.BICUBIC, reducing_gap=3.0)
    width, height = stored
    if as_raw:
        return ppm_header(width, height) + image.tobytes(), KIND_RAW, width, height
    out = io.BytesIO()
    image.save(out, "JPEG", quality=options.quality or 90)
    return out.getvalue(), KIND_JPEG, width, height


def _stored_size(width: int, height: int, options: PackOptions) -> tuple[int, int]:
    """The size an image is stored at: shrunk to --max-side, refused beyond what a pack's
    index records."""
    if options.max_side and max(width, height) > options.max_side:
        scale = options.max_side / max(width, height)
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
    if max(width, height) > MAX_SIDE:
        raise ValueError(f"{width} x {height} pixels: a pack records sides up to {MAX_SIDE} "
                         "px (pack with --max-side)")
    return width, height


def _stored_raw(path: str, width: int, height: int, options: PackOptions) -> bool:
    return options.store == "raw" or (options.store == "auto"
                                      and _raw_in_auto(path, width, height, options))


def _raw_in_auto(path: str, width: int, height: int, options: PackOptions) -> bool:
    """Small images, and a seeded random `raw_fraction` of the others (FFCV's 'proportion'
    mix: raw samples cost no decoding, at about 6x the bytes of a quality-90 JPEG)."""
    if max(width, height) <= options.raw_max_side:
        return True
    return random.Random(f"{options.seed}-{path}").random() < options.raw_fraction


def _fragment(dst: Path, split: str, number: int, suffix: str) -> Path:
    return dst / f".{split}-{number:05d}.{suffix}"


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> int:
    """Append one member; the offset of its data (after its single ustar header block)."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    data_at = tar.offset + tarfile.BLOCKSIZE
    tar.addfile(info, io.BytesIO(data))
    return data_at


def write_shard(job: ShardJob) -> ShardResult:
    """Write one shard under a temporary name, then its index fragment and statistics; the
    statistics file, renamed last, marks the shard finished."""
    dst = Path(job.dst)
    records = np.zeros(len(job.samples), INDEX_DTYPE)  # 32 bytes a sample, not a tuple's 300
    count = 0
    result = ShardResult(job.split, job.number)
    out = HashingFile(dst / shard_name(job.split, job.number))
    try:
        with out.file, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for position, (path, label) in enumerate(job.samples, job.first):
                try:
                    data, kind, width, height = encode_sample(path, job.options)
                except (OSError, ValueError, Image.DecompressionBombError) as err:
                    if job.strict:
                        raise DataError(f"unreadable source image {path}: {err} (--strict)") \
                            from None
                    result.skipped.append((path, str(err)))
                    continue
                data_at = _add_member(tar, f"{position:08d}.{EXTENSIONS[kind]}", data)
                _add_member(tar, f"{position:08d}.cls", f"{label}\n".encode())
                records[count] = (job.number, data_at, len(data), zlib.crc32(data), label,
                                  width, height, kind)
                count += 1
                result.per_class[label] = result.per_class.get(label, 0) + 1
    except BaseException:
        out.discard()
        raise
    result.samples, result.bytes = count, out.size
    result.sha256 = out.digest.hexdigest()
    save_npy(_fragment(dst, job.split, job.number, "npy"), records[:count])
    out.keep()
    write_whole(_fragment(dst, job.split, job.number, "json"), json.dumps(asdict(result)))
    return result


def _finished(dst: Path, job: ShardJob) -> ShardResult | None:
    stats = _fragment(dst, job.split, job.number, "json")
    if not (stats.is_file() and (dst / shard_name(job.split, job.number)).is_file()):
        return None
    try:  # a fragment that cannot be read is a shard to write again
        data = read_fragment(stats)
        data["per_class"] = {int(k): v for k, v in data["per_class"].items()}
        data["skipped"] = [tuple(s) for s in data["skipped"]]
        return ShardResult(**data)
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        return None


# --- the whole pack --------------------------------------------------------------------------

def _plan_fingerprint(classes, splits, options: PackOptions) -> str:
    """What an interrupted pack resumes only with: the classes, every file and its label,
    the options (hashed file by file: no text of every path at once)."""
    digest = hashlib.sha256(json.dumps([classes, asdict(options), SHARD_SAMPLES]).encode())
    for split, samples in splits.items():
        digest.update(f"\0{split}\0{len(samples)}".encode())
        for path, label in samples:
            digest.update(f"{path}\0{label}\n".encode())
    return digest.hexdigest()


def pack(src: Path, dst: Path, options: PackOptions, workers: int | None = None,
         strict: bool = False, overwrite: bool = False, log=print) -> dict:
    """Pack `src` into `dst`; the manifest (also written to dst/pack.json)."""
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    started = time.perf_counter()
    classes, splits = read_source(src)
    fingerprint = _plan_fingerprint(classes, splits, options)
    resumed = prepare_destination(dst, fingerprint, overwrite)
    jobs = plan_shards(splits, dst, options, strict)
    done = {(j.split, j.number): r for j in jobs if (r := _finished(dst, j)) is not None}
    todo = [j for j in jobs if (j.split, j.number) not in done]
    if resumed:
        log(f"pack: resuming {dst}: {len(done)} of {len(jobs)} shards already written")
    total = sum(len(j.samples) for j in todo)
    with progress_bar(f"packing {len(todo)} shards", total) as advance:
        for result in run_jobs(write_shard, todo, workers):
            done[(result.split, result.number)] = result
            advance(result.samples + len(result.skipped))
    manifest = _write_manifest(dst, src, classes, splits, jobs, done, options)
    manifest["seconds"] = round(time.perf_counter() - started, 1)
    return manifest


def _write_manifest(dst: Path, src: Path, classes, splits, jobs, done, options) -> dict:
    manifest = {"format": FORMAT, "version": VERSION, "pack_id": uuid.uuid4().hex,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "source": str(src),
                "options": asdict(options), "classes": classes, "splits": {}}
    for split in splits:
        results = [done[(j.split, j.number)] for j in jobs if j.split == split]
        index = np.concatenate([np.load(_fragment(dst, split, r.number, "npy"))
                                for r in results]) if results else np.zeros(0, INDEX_DTYPE)
        save_npy(dst / index_name(split), index)
        per_class = [0] * len(classes)
        for result in results:
            for label, count in result.per_class.items():
                per_class[label] += count
        manifest["splits"][split] = {
            "samples": int(len(index)),
            "index": {"file": index_name(split), "sha256": file_sha256(dst / index_name(split))},
            "shards": [{"file": shard_name(split, r.number), "samples": r.samples,
                        "bytes": r.bytes, "sha256": r.sha256} for r in results],
            "per_class": per_class,
            "skipped": [list(s) for r in results for s in r.skipped],
        }
    write_whole(dst / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    for leftover in [*dst.glob(".*-*.npy"), *dst.glob(".*-*.json"), *leftovers(dst),
                     dst / PLAN]:
        leftover.unlink(missing_ok=True)
    return manifest


def describe(manifest: dict) -> str:
    """The summary `hpctrain pack` prints: files, bytes, samples per class, skipped files."""
    lines = [f"packed {manifest['source']} in {manifest.get('seconds', 0):.1f} s "
             f"(pack {manifest['pack_id'][:8]}):"]
    classes = manifest["classes"]
    for split, entry in manifest["splits"].items():
        size = sum(s["bytes"] for s in entry["shards"])
        counts = entry["per_class"]
        lines.append(f"  {split}: {entry['samples']} samples in {len(entry['shards'])} shards, "
                     f"{size / 2**20:.1f} MiB; per class min {min(counts, default=0)}, "
                     f"max {max(counts, default=0)}")
        shown = ", ".join(f"{classes[i]} {c}" for i, c in enumerate(counts[:10]))
        lines.append(f"    {shown}{', ...' if len(counts) > 10 else ''}")
        for path, err in entry["skipped"][:10]:
            lines.append(f"    skipped unreadable {path}: {err}")
        if len(entry["skipped"]) > 10:
            lines.append(f"    ... and {len(entry['skipped']) - 10} more skipped "
                         f"(all listed in pack.json)")
    return "\n".join(lines)
