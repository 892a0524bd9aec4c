"""Files an attacker (or a broken disk) could leave where hpctrain reads: checkpoints whose
pickles run a command, and damaged checkpoints. Each hostile payload touches a marker file,
so a test can tell whether it ran."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import BytesStorageMetadata


class RunsACommand:
    """Unpickling this runs `touch MARKER` (what a crafted pickle does)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant_hostile_index(checkpoint: Path, marker: Path) -> None:
    """Replace the DCP index (.metadata, read with pickle) by a command."""
    (checkpoint / ".metadata").write_bytes(pickle.dumps(RunsACommand(marker)))


def plant_hostile_value(checkpoint: Path, marker: Path) -> str:
    """Leave the index a true index, but point one of its non-tensor values (an optimiser
    hyper-parameter, read by torch.load) at a pickle that runs a command; the value's name."""
    index_file = checkpoint / ".metadata"
    index = pickle.loads(index_file.read_bytes())  # our own file: trusted here
    name = next(k for k, v in index.state_dict_metadata.items()
                if isinstance(v, BytesStorageMetadata))
    payload = io.BytesIO()
    torch.save(RunsACommand(marker), payload)
    shard = checkpoint / "__0_0.distcp"
    offset = shard.stat().st_size
    with open(shard, "ab") as handle:
        handle.write(payload.getvalue())
    for key, where in index.storage_data.items():
        if key.fqn == name:
            where.offset, where.length = offset, len(payload.getvalue())
    index_file.write_bytes(pickle.dumps(index))
    return name


def truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# name -> how a checkpoint is damaged, and the words naming it
DAMAGE = {
    "truncated shard": (lambda c: truncate(c / "__0_0.distcp"), "__0_0.distcp is truncated"),
    "empty shard": (lambda c: (c / "__0_0.distcp").write_bytes(b""), "__0_0.distcp is truncated"),
    "empty meta.json": (lambda c: (c / "meta.json").write_text(""), "meta.json is not valid JSON"),
    "broken meta.json": (lambda c: (c / "meta.json").write_text('{"step": 10, "world_s'),
                         "meta.json is not valid JSON"),
    "meta.json of another step": (lambda c: (c / "meta.json").write_text(
        '{"step": 3, "world_size": 1, "progress": {}, "scheduler": {}}'),
        "does not hold this checkpoint's step"),
    "empty index": (lambda c: (c / ".metadata").write_bytes(b""), ".metadata is not a checkpoint"),
    "missing RNG state": (lambda c: (c / "rng_rank0.pt").unlink(), "rng_rank0.pt is missing"),
}


def edit_meta(checkpoint: Path, change) -> None:
    """Rewrite the checkpoint's meta.json with `change(meta)` applied (a valid JSON file whose
    fields a resume must not trust)."""
    path = checkpoint / "meta.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


# name -> how meta.json's fields are damaged (JSON still valid), and the words naming it
META_DAMAGE = {
    "no scaler": (lambda m: m.pop("scaler"), "scaler is missing"),
    "step of text": (lambda m: m["progress"].update(step="x"), 'progress.step is "x"'),
    "bad scheduler": (lambda m: m["scheduler"].update(last_epoch=[1]),
                      "scheduler.last_epoch is [1]"),
    "changes a number": (lambda m: m["progress"].update(changes=5), "progress.changes is 5"),
    "wall seconds of text": (lambda m: m["progress"].update(wall_seconds="soon"),
                             'progress.wall_seconds is "soon"'),
    "scheduler a number": (lambda m: m.update(scheduler=7), "scheduler is 7"),
    "a group's setting of text": (lambda m: m["scheduler"].update(groups=[{"lr": "high"}]),
                                  'scheduler.groups is [{"lr": "high"}]'),
}
DAMAGE["meta.json with a step of text"] = (
    lambda c: edit_meta(c, META_DAMAGE["step of text"][0]), META_DAMAGE["step of text"][1])


# ---- weight files (issue 51): a pickle in a weights cache, a safetensors file that lies


def plant_hostile_weights(path: Path, marker: Path, torch_save: bool = True) -> None:
    """A weight file that runs `touch MARKER` when unpickled: saved by torch.save (a zip
    archive, as torchvision's files are) or a plain pickle."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if torch_save:
        torch.save(RunsACommand(marker), path)
    else:
        path.write_bytes(pickle.dumps(RunsACommand(marker)))


def _rewrite_safetensors_header(path: Path, change) -> None:
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    change(next(entry for key, entry in header.items()  # a tensor of one value or more
                if key != "__metadata__" and entry["shape"]))
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length:])


def _stretch(entry: dict) -> None:
    entry["data_offsets"][1] += 10**9


def _double(entry: dict) -> None:
    entry["shape"] = [side * 2 for side in entry["shape"]]


# name -> how a safetensors file's header lies
FALSE_SAFETENSORS = {
    "header length 2^63": lambda p: p.write_bytes((2**63).to_bytes(8, "little")
                                                  + p.read_bytes()[8:]),
    "offsets past the end": lambda p: _rewrite_safetensors_header(p, _stretch),
    "shape and offsets disagree": lambda p: _rewrite_safetensors_header(p, _double),
}
