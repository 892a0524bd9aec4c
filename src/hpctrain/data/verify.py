"""`hpctrain pack --verify PACK`: every byte of a pack checked against what its manifest and
index recorded, with every damage named, not only the first.

Opening a pack for training checks only what is cheap (the index's SHA-256, the shards'
sizes) and each sample's CRC-32 when it is read; a flipped bit in a sample no epoch has read
yet, or in a shard that was copied over a flaky link, shows up only then. This reads it all:
the SHA-256 of the index and of every shard, and, for image packs, the CRC-32 of every sample,
so a damaged shard is narrowed down to the samples that are damaged. Token packs record no
per-document checksum: their shards are checked whole.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from hpctrain.data.images import image_pack as images
from hpctrain.data.tokens import token_pack as tokens
from hpctrain.data.packs import MANIFEST, file_sha256, links_out, manifest_json
from hpctrain.errors import DataError
from hpctrain.progress_bar import progress_bar

@dataclass
class Verified:
    """What was checked, and every damaged file or sample found."""

    root: str
    kind: str  # image or token pack
    files: int = 0
    bytes: int = 0
    samples: int = 0  # samples whose CRC-32 was checked (image packs)
    damaged_files: list[str] = field(default_factory=list)  # "name: why"
    damaged_samples: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged_files and not self.damaged_samples

    def as_dict(self) -> dict:
        return {"pack": self.root, "kind": self.kind, "ok": self.ok, "files": self.files,
                "bytes": self.bytes, "samples_checked": self.samples,
                "damaged_files": self.damaged_files, "damaged_samples": self.damaged_samples}

    def describe(self, most: int = 50) -> str:
        checked = f"{self.files} files, {self.bytes / 1e9:.2f} GB" + (
            f", {self.samples:,} samples' CRC-32" if self.kind == "image" else "")
        if self.ok:
            return f"pack {self.root}: intact ({checked} checked)"
        lines = [f"pack {self.root}: DAMAGED ({checked} checked)"]
        lines += [f"  {problem}" for problem in self.damaged_files]
        for sample in self.damaged_samples[:most]:
            lines.append(f"  {sample['split']} sample {sample['sample']} (label "
                         f"{sample['label']}): {sample['shard']} bytes {sample['offset']}-"
                         f"{sample['offset'] + sample['size']} fail their CRC-32")
        if len(self.damaged_samples) > most:
            lines.append(f"  and {len(self.damaged_samples) - most} more damaged samples "
                         "(--json lists all)")
        lines.append("restore the damaged files from their source copy, or re-pack")
        return "\n".join(lines)


def verify(root: Path | str) -> Verified:
    root = Path(root).expanduser()
    manifest = root / MANIFEST
    data = manifest_json(manifest, "give pack --verify a pack folder made by hpctrain pack")
    found = data.get("format") if isinstance(data, dict) else None
    if found == images.FORMAT:
        return _verify_images(root)
    if found == tokens.FORMAT:
        return _verify_tokens(root, data)
    raise DataError(f"pack --verify {root}: {MANIFEST} is of format {found!r}, not an "
                    f"hpctrain pack ({images.FORMAT} or {tokens.FORMAT})")


def _check_file(root: Path, name: str, size: int | None, sha256: str, result: Verified,
                advance=None) -> bool:
    """Whether the pack's file `name` is there (its own, not a link out of the pack), of its
    size, with its SHA-256; a damage recorded if not."""
    result.files += 1
    path = root / name
    if links_out(root, name):
        result.damaged_files.append(f"{name}: a link out of the pack (to "
                                    f"{os.readlink(root / name)}), not read")
        return False
    if not path.is_file():
        result.damaged_files.append(f"{path.name}: missing")
        return False
    actual = path.stat().st_size
    if size is not None and actual != size:
        result.damaged_files.append(f"{path.name}: {actual} bytes, the manifest says {size}")
        return False
    digest = file_sha256(path, advance=advance)
    result.bytes += actual
    if digest != sha256:
        result.damaged_files.append(f"{path.name}: SHA-256 differs from the manifest's")
        return False
    return True


def _verify_images(root: Path) -> Verified:
    manifest = images._read_manifest(root / MANIFEST)
    result = Verified(str(root), "image")
    total = sum(s.bytes for e in manifest.splits.values() for s in e.shards)
    with progress_bar(f"verifying {root.name}", total) as advance:
        for name, entry in manifest.splits.items():
            index_path = root / entry.index.file
            if not _check_file(root, entry.index.file, None, entry.index.sha256, result):
                continue  # without its index a split's samples cannot be located
            index = np.load(index_path, mmap_mode="r", allow_pickle=False)
            for number, shard in enumerate(entry.shards):
                _check_file(root, shard.file, shard.bytes, shard.sha256, result, advance)
                path = root / shard.file
                if not links_out(root, shard.file) and path.is_file() and \
                        path.stat().st_size == shard.bytes:
                    _check_samples(path, index, number, name, result)
    return result


def _check_samples(path: Path, index: np.ndarray, number: int, split: str,
                   result: Verified) -> None:
    """Each sample of the shard against its CRC-32 (read again from the page cache): a
    damaged shard narrowed down to its damaged samples."""
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    for sample in np.flatnonzero(index["shard"] == number):
        record = index[sample]
        start, size = int(record["offset"]), int(record["size"])
        result.samples += 1
        if zlib.crc32(memoryview(mapped[start:start + size])) != int(record["crc32"]):
            result.damaged_samples.append({"split": split, "sample": int(sample),
                                           "label": int(record["label"]), "shard": path.name,
                                           "offset": start, "size": size})


def _verify_tokens(root: Path, data: dict) -> Verified:
    try:
        manifest = tokens.Manifest.model_validate(data)
    except ValidationError as err:
        raise DataError(f"pack --verify {root}: {MANIFEST} is not a valid token pack "
                        f"manifest ({err.errors()[0]['msg']})") from None
    result = Verified(str(root), "token")
    total = sum(s.bytes for e in manifest.splits.values() for s in e.shards)
    with progress_bar(f"verifying {root.name}", total) as advance:
        for entry in manifest.splits.values():
            _check_file(root, entry.index.file, None, entry.index.sha256, result)
            for shard in entry.shards:
                _check_file(root, shard.file, shard.bytes, shard.sha256, result, advance)
    return result
