"""Checkpoints that survive crashes, preemption and a change of world size.

A checkpoint is a folder such as `checkpoints/step_00000120/`, written with
torch.distributed.checkpoint (DCP): every rank writes its own shard in parallel, and a later
run on any number of processes reads back the pieces it needs (DCP reshards; that is why we
use it rather than one file per run). Beside the shards: `meta.json` (step, world size,
schedule, loss scale, progress: plain, readable by tools) and one `rng_rankN.pt` per rank.

Atomicity: everything goes to a hidden `.step_00000120.partial/` folder first; rank 0 writes
meta.json last and renames the folder, so a crash at any moment leaves either the previous
complete checkpoint or the new one, never a half-written folder under a checkpoint's name.
With `async_save` the shards are copied to host memory at once and written by a background
thread; the rename happens at a later step boundary, once the write has finished.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from hpctrain.errors import ConfigError, cannot_write
from hpctrain.runs.directory import CHECKPOINT_META as META
from hpctrain.runs.directory import CHECKPOINT_MODULE_STATE as MODULE_STATE
from hpctrain.runs.directory import CHECKPOINT_NAME as NAME
from hpctrain.runs.directory import list_checkpoints
from hpctrain.train.checkpoints.safe_checkpoint import (SafeEmptyPlanner, SafePlanner, SafeReader,
                                                        read_meta)
from hpctrain.writers import new_file, own_folder

# DCP warns that it "assumes a single process" whenever no process group exists: that is
# exactly our single-process case, not a mistake.
warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
warnings.filterwarnings("ignore", message=".*assuming the intent is to.*single process.*")


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:08d}"


def step_of(checkpoint: Path) -> int:
    return int(NAME.match(checkpoint.name).group(1))


def first_failure(err: CheckpointException) -> BaseException:
    """The error behind DCP's CheckpointException (a BaseException that wraps every rank's
    error): the lowest rank's."""
    failures = getattr(err, "failures", None) or {}
    return failures[min(failures)][0] if failures else err


def _interrupted(err: BaseException) -> bool:
    """A KeyboardInterrupt is `err` or what it was raised over."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


class Checkpointer:
    """Saves and loads one run's checkpoints; at most one asynchronous save in flight. Keeps
    the last `keep_last` and those of the `protected` steps (a ModelCheckpoint's best)."""

    def __init__(self, folder: Path, keep_last: int, distributed, async_save: bool):
        self.folder = folder
        self.keep_last = keep_last
        self.dist = distributed
        self.async_save = async_save
        self.pending = None  # (future, partial folder, final folder, meta)
        self.protected: set[int] = set()  # steps kept besides the last ones (the best)

    def save(self, step: int, state: dict, meta: dict, module_state: bytes | None = None) \
            -> Path:
        """Write `state` (tensors: model, optimiser, EMA) and `meta` (plain values) as the
        checkpoint of `step`, and rank 0's `module_state` (what a LightningModule's
        on_save_checkpoint added, saved: tensors and plain values) beside them; returns its final
        path (complete at once unless async). A write that fails (full disk, quota) discards
        the partial folder and raises OutputError; the earlier checkpoints stay as they
        were."""
        self.wait()
        final = checkpoint_path(self.folder, step)
        partial = final.with_name(f".{final.name}.partial")
        meta = {**meta, "step": step, "world_size": self.dist.world_size,
                "saved_at": time.time()}
        with self._failing_write(partial, final):
            if self.dist.is_main:
                own_folder(self.folder)  # never a link: the checkpoints would go through it
                _clear(partial)
                partial.mkdir()
            self.dist.barrier()
            _write_file(partial / f"rng_rank{self.dist.rank}.pt", capture_rng())
            if module_state is not None and self.dist.is_main:
                _write_file(partial / MODULE_STATE, module_state)
            if self.async_save:
                future = dcp.async_save(state, checkpoint_id=partial,
                                        process_group=self.dist.checkpoints)
                self.pending = (future, partial, final, meta)
            else:
                dcp.save(state, checkpoint_id=partial, process_group=self.dist.checkpoints)
                self._publish(partial, final, meta)
        return final

    def poll(self) -> None:
        """Publish a finished asynchronous save (call at step boundaries)."""
        if self.pending is not None and self.pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight, if any, is complete and published."""
        if self.pending is None:
            return
        future, partial, final, meta = self.pending
        self.pending = None
        with self._failing_write(partial, final):
            future.result()
            self._publish(partial, final, meta)

    @contextlib.contextmanager
    def _failing_write(self, partial: Path, final: Path):
        """Turn a failed write into an OutputError that names what is kept, after removing
        the partial folder (which would hold the space a retry needs). A Ctrl-C that landed
        in the write stays a KeyboardInterrupt: torch's zip writer, interrupted, raises its
        own RuntimeError over it, which the run reported as an internal error."""
        try:
            yield
        except (OSError, CheckpointException) as err:
            cause = first_failure(err) if isinstance(err, CheckpointException) else err
            if _interrupted(cause):
                if self.dist.is_main:
                    shutil.rmtree(partial, ignore_errors=True)
                raise KeyboardInterrupt from None
            if not isinstance(cause, OSError):
                raise cause from None
            if self.dist.is_main:
                shutil.rmtree(partial, ignore_errors=True)
            kept = list_checkpoints(self.folder)
            raise cannot_write(f"checkpoint {final.name} in {self.folder}", cause,
                               "It was discarded; " + (f"{kept[-1].name} is the last good "
                               "checkpoint" if kept else "no checkpoint is kept yet")
                               + ". Free space (or set output_dir elsewhere) and run again "
                               "with resume=auto") from None

    def _publish(self, partial: Path, final: Path, meta: dict) -> None:
        """Rank 0: meta.json last, then the rename that makes the checkpoint exist. DCP's
        save ends with a gather of every rank's write results, so all shards are on disk."""
        if not self.dist.is_main:
            return
        _write_file(partial / META, json.dumps(meta, indent=1).encode())
        if final.exists():  # saved again at the same step (e.g. preempted right after a save)
            stale = final.with_name(f".{final.name}.stale")
            _clear(stale)
            os.replace(final, stale)
            shutil.rmtree(stale)
        os.replace(partial, final)
        _fsync_dir(self.folder)
        kept = {checkpoint_path(self.folder, step).name for step in self.protected}
        for old in list_checkpoints(self.folder)[:-self.keep_last]:
            if old.name not in kept:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, path: Path, state: dict) -> tuple[dict, dict | None]:
        """Fill `state` in place from `path`; return (meta, this rank's RNG state or None when
        the world size changed and no state belongs to this rank)."""
        meta = read_meta(path)
        reader = SafeReader(path)
        try:
            dcp.load(state, storage_reader=reader, planner=SafePlanner(),
                     process_group=self.dist.checkpoints)
        except CheckpointException as err:
            raise first_failure(err) from None
        rng_file = path / f"rng_rank{self.dist.rank}.pt"
        same_layout = meta["world_size"] == self.dist.world_size and rng_file.is_file()
        rng = torch.load(rng_file, weights_only=True) if same_layout else None
        return meta, rng


def read_module_state(path: Path) -> dict:
    """What the module's on_save_checkpoint added to the checkpoint at `path` (empty where it
    added nothing, or the checkpoint is of another kind of run); tensors and plain values
    only, as every file hpctrain reads back."""
    file = path / MODULE_STATE
    if not file.is_file():
        return {}
    try:
        return torch.load(file, weights_only=True)
    except Exception as err:  # pickle's and torch's own errors: the file is damaged
        raise ConfigError(f"{file} cannot be read back ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:200]}); it is written by hpctrain: "
                          "resume from an earlier checkpoint") from None


def saved_keys(path: Path) -> set[str]:
    """The names of everything a checkpoint holds ("model.embed.weight", "optim.state...")."""
    return set(SafeReader(path).read_metadata().state_dict_metadata)


def read_checkpoint(path: Path) -> dict:
    """A whole checkpoint as plain CPU tensors, plus its `meta`, in one process (for tools
    and tests: no model or process group needed). Read as a resume reads it: safely."""
    state: dict = {}
    reader = SafeReader(path)
    try:
        _load_state_dict(state, storage_reader=reader, planner=SafeEmptyPlanner(),
                         no_dist=True)
    except CheckpointException as err:
        raise first_failure(err) from None
    return {**state, "meta": read_meta(path)}


def _clear(path: Path) -> None:
    """Whatever is at `path` removed, a link itself (not what it points to)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _write_file(path: Path, payload) -> None:
    """A new file in the checkpoint's fresh folder (created there, never through a link)."""
    with new_file(path) as handle:
        if isinstance(payload, bytes):
            handle.write(payload)
        else:
            torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def capture_rng() -> dict:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    keys = state["numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, state["numpy_pos"], 0, 0.0))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
