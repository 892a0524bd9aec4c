"""Files an attacker (or a broken disk) could leave where hpctrain reads: checkpoints whose
pickles run a command, and damaged checkpoints. Each hostile payload touches a marker file,
so a test can tell whether it ran."""

from __future__ import annotations

import io
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
