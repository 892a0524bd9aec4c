"""Reading a checkpoint without trusting it: no code runs, nothing outside its folder is read, and
damage is named before anything is loaded.

torch.distributed.checkpoint keeps its index (`.metadata`) as a pickle and reads it with plain
`pickle.load`, and its default planner reads every non-tensor value (an optimiser's LR,
momentum, parameter lists) with `torch.load(weights_only=False)`: a checkpoint folder that came
from elsewhere could run any command on resume. Here the index goes through an unpickler that
admits only DCP's metadata types (a few dataclasses, torch.Size, dtypes and layouts), every
file the index names must be a plain file of the folder holding the byte ranges it claims, and
values are accepted only when `torch.load(weights_only=True)` can read them.

`problem(path)` is the cheap check run before a resume chooses a checkpoint: meta.json (by
progress_state's rules), the index, the shard files' sizes, one RNG file per rank. It catches
truncated or empty files and a broken meta.json without reading the tensors.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import (DefaultLoadPlanner,
                                                           _EmptyStateDictLoadPlanner)
from torch.distributed.checkpoint.filesystem import _StorageInfo

from hpctrain.errors import DataError
from hpctrain.readers import Unreadable, parse_json, read_capped
from hpctrain.runs.directory import CAPS
from hpctrain.runs.directory import CHECKPOINT_META as META
from hpctrain.runs.directory import CHECKPOINT_NAME as NAME
from hpctrain.train.checkpoints.progress_state import meta_problem

INDEX = ".metadata"

_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
    for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                 "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "_MEM_FORMAT_ENCODING") if hasattr(dcp_metadata, name)
}
_ALLOWED[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = _StorageInfo
_ALLOWED[("torch", "Size")] = torch.Size
_ALLOWED[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
_ALLOWED.update({("pathlib", name): getattr(__import__("pathlib"), name)
                 for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")})
_ALLOWED[("collections", "OrderedDict")] = __import__("collections").OrderedDict


class DamagedCheckpoint(DataError):
    """A checkpoint folder that cannot be, or must not be, loaded (exit code 2)."""


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that can build DCP's index and nothing else."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a checkpoint index "
                                     "never holds")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it holds a persistent reference")


def read_index(folder: Path) -> dcp_metadata.Metadata:
    """The DCP index of `folder`, unpickled safely and checked against the files beside it."""
    path = folder / INDEX
    try:
        with open(path, "rb") as handle:
            index = _MetadataUnpickler(handle).load()
    except FileNotFoundError:
        raise DamagedCheckpoint(f"checkpoint {folder}: {INDEX} is missing") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, OSError) as err:
        raise DamagedCheckpoint(f"checkpoint {folder}: {INDEX} is not a checkpoint index "
                                f"({err}); it was not loaded") from None
    if not isinstance(index, dcp_metadata.Metadata) or not isinstance(
            getattr(index, "storage_data", None), dict):
        raise DamagedCheckpoint(f"checkpoint {folder}: {INDEX} holds a "
                                f"{type(index).__name__}, not a checkpoint index")
    _check_byte_ranges(folder, index.storage_data)
    return index


def _check_byte_ranges(folder: Path, storage: dict) -> None:
    """Every file the index names is a plain file of `folder` that holds its byte ranges."""
    needed: dict[str, int] = {}
    for where in storage.values():
        name = getattr(where, "relative_path", None)
        offset, length = getattr(where, "offset", None), getattr(where, "length", None)
        if not (isinstance(name, str) and _plain_name(name)):
            raise DamagedCheckpoint(f"checkpoint {folder}: {INDEX} names the file {name!r}, "
                                    "which is not a file of the checkpoint folder")
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0
                and length >= 0):
            raise DamagedCheckpoint(f"checkpoint {folder}: {INDEX} gives {name} an invalid "
                                    f"byte range ({offset!r}, {length!r})")
        needed[name] = max(needed.get(name, 0), offset + length)
    for name, end in needed.items():
        path = folder / name
        if not path.is_file() or path.is_symlink():
            raise DamagedCheckpoint(f"checkpoint {folder}: {name} is missing")
        size = path.stat().st_size
        if size < end:
            raise DamagedCheckpoint(f"checkpoint {folder}: {name} is truncated ({size} bytes, "
                                    f"the index needs {end})")


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and os.path.basename(name) == name \
        and "\\" not in name and "\0" not in name


def read_meta(folder: Path) -> dict:
    """meta.json, checked for the step (the folder's) and the world size a load relies on."""
    try:
        meta = parse_json(read_capped(folder / META, CAPS[META]))
    except FileNotFoundError:
        raise DamagedCheckpoint(f"checkpoint {folder}: {META} is missing") from None
    except Unreadable as err:
        raise DamagedCheckpoint(f"checkpoint {folder}: {META} {err}") from None
    except (OSError, ValueError) as err:
        raise DamagedCheckpoint(f"checkpoint {folder}: {META} is not valid JSON "
                                f"({err})") from None
    match = NAME.match(folder.name)
    if not isinstance(meta, dict) or not isinstance(meta.get("world_size"), int) or \
            meta["world_size"] < 1 or not isinstance(meta.get("step"), int) or \
            (match is not None and meta["step"] != int(match.group(1))):
        raise DamagedCheckpoint(f"checkpoint {folder}: {META} does not hold this checkpoint's "
                                "step and world size")
    return meta


def problem(folder: Path) -> str | None:
    """Why a run's checkpoint `folder` cannot be resumed from, or None when its files are
    whole: meta.json with the run's progress, the index, the shards' sizes, an RNG file per
    rank."""
    try:
        meta = read_meta(folder)
        if (why := meta_problem(meta)) is not None:
            raise DamagedCheckpoint(f"checkpoint {folder}: {META}: {why}")
        read_index(folder)
        for rank in range(meta["world_size"]):
            rng = folder / f"rng_rank{rank}.pt"
            if not rng.is_file() or rng.stat().st_size == 0:
                raise DamagedCheckpoint(f"checkpoint {folder}: {rng.name} is missing or empty")
    except DamagedCheckpoint as damage:
        return str(damage)
    return None


class SafeReader(FileSystemReader):
    """DCP's file reader, with the index read by `read_index`, once, when the reader is made:
    a bad index is named (DamagedCheckpoint) before DCP starts, and logs its own tracebacks."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.index = read_index(Path(path))

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        index = self.index
        if getattr(index, "storage_meta", None) is None:
            index.storage_meta = dcp_metadata.StorageMeta()
        index.storage_meta.load_id = self.load_id
        return index


class _PlainValues:
    """Accept a checkpoint's non-tensor values only if weights_only loading can read them
    (plain numbers, strings, lists, dicts, tensors); DCP's own reading then runs on bytes
    known to hold nothing else."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except Exception as err:  # UnpicklingError, or anything a hostile pickle raises
            raise DamagedCheckpoint(f"checkpoint value {read_item.dest_index.fqn!r} is not "
                                    f"plain data ({str(err).splitlines()[0]}); it was not "
                                    "loaded") from None
        value.seek(0)
        super().load_bytes(read_item, value)


class SafePlanner(_PlainValues, DefaultLoadPlanner):
    """Loads into a given state dict."""


class SafeEmptyPlanner(_PlainValues, _EmptyStateDictLoadPlanner):
    """Loads everything a checkpoint holds, without a state dict to fill (tools, tests)."""
