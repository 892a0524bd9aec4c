"""`data.images.cache`: a node-local copy of a pack, made once per node and reused while valid.

Random reads of small samples are what parallel file systems (GPFS, Lustre) serve worst; the
node's own SSD or RAM disk serves them at memory speed. The copy goes to
`<base>/hpctrain-cache/<pack_id>/`, where base is the job's node-local scratch (`auto`: the
folder the caller found, cluster.environment.node_local_scratch) or a given path. Every file
is hashed while it is copied and compared with the manifest's SHA-256, so a corrupt source is named instead of
cached. The copy is made under a temporary name and renamed when complete and verified, so a
crashed copy is never mistaken for a cache, and two jobs on one node copying at once both end
with one good cache. Reuse checks the manifest's bytes and every file's size; the per-sample
CRC-32 at read time catches later corruption.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import uuid
from pathlib import Path

from hpctrain.data.packs import MANIFEST, MANIFEST_CAP, pack_file
from hpctrain.data.images.image_pack import Pack
from hpctrain.errors import DataError
from hpctrain.readers import read_capped
from hpctrain.writers import replacing

CACHE_FOLDER = "hpctrain-cache"
VERIFIED = ".verified"
SPACE_MARGIN = 1.05  # leave the node's disk 5 % more than the pack needs


def _log(text: str) -> None:
    print(f"hpctrain: {text}", file=sys.stderr)


def cache_base(setting: str, scratch: Path | None) -> Path | None:
    """The node-local folder `setting` names: None for off, or for auto without one (auto:
    the job's node-local `scratch`)."""
    if setting == "off":
        return None
    if setting == "auto":
        return scratch
    return Path(setting).expanduser()


def pack_files(pack: Pack) -> list[tuple[str, int | None, str | None]]:
    """(file name, bytes, sha256) of every file of the pack; the manifest has no size or hash
    of itself."""
    files = [(MANIFEST, None, None)]
    for entry in pack.manifest.splits.values():
        files.append((entry.index.file, None, entry.index.sha256))
        files += [(s.file, s.bytes, s.sha256) for s in entry.shards]
    return files


def _is_valid(target: Path, pack: Pack) -> bool:
    if not (target / VERIFIED).is_file():
        return False
    try:
        if read_capped(target / MANIFEST, MANIFEST_CAP) != \
                read_capped(pack.root / MANIFEST, MANIFEST_CAP):
            return False
        return all(size is None or (target / name).stat().st_size == size
                   for name, size, _ in pack_files(pack))
    except (OSError, ValueError):  # absent, a link, past its cap: copied again
        return False


def _copy_verified(source: Path, destination: Path, sha256: str | None) -> None:
    digest = hashlib.sha256()
    with open(source, "rb") as reader, replacing(destination) as writer:
        while chunk := reader.read(16 << 20):
            digest.update(chunk)
            writer.write(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:  # nothing renamed into place
            raise DataError(f"pack {source.parent}: {source.name} does not match its SHA-256 "
                            f"in {MANIFEST}: the pack is corrupted at its source. Restore the "
                            "file or re-pack; nothing was cached")


def node_local_pack(pack: Pack, setting: str, scratch: Path | None = None) -> Pack:
    """The pack to read: a valid node-local copy (made now if needed), or `pack` itself when
    caching is off, when auto finds no node-local folder (`scratch`) or space, or when the
    pack already lives there."""
    base = cache_base(setting, scratch)
    if base is None:
        return pack
    target = base / CACHE_FOLDER / pack.pack_id
    if pack.root.resolve().is_relative_to(base.resolve()):
        return pack  # already node-local
    if _is_valid(target, pack):
        _log(f"data.images.cache: reusing the node-local copy {target}")
        return Pack(target)
    needed = sum((pack.root / name).stat().st_size for name, _, _ in pack_files(pack))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(target.parent).free
    except OSError as err:
        return _cannot(setting, pack, f"cannot use {target.parent} ({err})")
    if needed * SPACE_MARGIN > free:
        return _cannot(setting, pack, f"the pack needs {needed / 1e9:.1f} GB and "
                       f"{target.parent} has {free / 1e9:.1f} GB free")
    if target.exists() or target.is_symlink():  # damaged since it was made: replace it
        _log(f"data.images.cache: {target} no longer matches {pack.root}; copying again")
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
    _log(f"data.images.cache: copying {pack.root} ({needed / 1e9:.2f} GB) to {target}")
    partial = target.parent / f".{pack.pack_id}.partial-{uuid.uuid4().hex[:8]}"
    partial.mkdir()
    try:
        for name, _, sha256 in pack_files(pack):
            _copy_verified(pack_file(pack.root, name), partial / name, sha256)
        (partial / VERIFIED).touch()
        try:
            partial.rename(target)
        except OSError:  # another job on this node finished first: keep its copy
            if not _is_valid(target, pack):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return Pack(target)


def _cannot(setting: str, pack: Pack, reason: str) -> Pack:
    if setting == "auto":
        _log(f"data.images.cache=auto: {reason}; reading {pack.root} in place")
        return pack
    raise DataError(f"data.images.cache={setting}: {reason}. Free space there, choose another "
                    "data.images.cache path, or set data.images.cache=off")
