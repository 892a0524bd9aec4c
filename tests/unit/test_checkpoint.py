"""Atomic checkpoints, resume=auto, and resumed runs that end bitwise equal.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_checkpoint.py."""

from pathlib import Path

import pytest
import torch


from hpctrain.cluster.environment import detect
from hpctrain.errors import OutputError
from hpctrain.parallel.processes import Distributed
from hpctrain.runs.directory import list_checkpoints
from hpctrain.train.checkpoints import checkpoint as ckpt
from hpctrain.train.checkpoints.checkpoint import Checkpointer


def checkpointer(folder, keep_last=3, async_save=False) -> Checkpointer:
    single = Distributed(detect({}), "none", hosts=("here",))
    return Checkpointer(folder, keep_last, single, async_save)


def test_keep_last_and_stray_partial_folders(tmp_path):
    (tmp_path / ".step_00000009.partial").mkdir(parents=True)  # a crash mid-save
    saver = checkpointer(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        saver.save(step, {"w": torch.tensor([float(step)])}, {"note": step})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    state = {"w": torch.zeros(1)}
    meta, rng = saver.load(tmp_path / "step_00000004", state)
    assert state["w"].item() == 4 and meta["step"] == 4 and meta["note"] == 4
    assert meta["world_size"] == 1 and rng is not None


def test_asynchronous_save_holds_the_state_of_the_moment_it_was_called(tmp_path):
    saver = checkpointer(tmp_path, async_save=True)
    weights = torch.zeros(256, 256)
    saver.save(1, {"w": weights}, {})
    weights.add_(1.0)  # training goes on while the write runs
    saver.wait()
    state = {"w": torch.empty(256, 256)}
    saver.load(tmp_path / "step_00000001", state)
    assert torch.count_nonzero(state["w"]) == 0


def test_a_failed_write_never_replaces_a_good_checkpoint(tmp_path, monkeypatch):
    saver = checkpointer(tmp_path)
    saver.save(1, {"w": torch.tensor([1.0])}, {})

    def crash(state, checkpoint_id, process_group):
        (Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"half a shard")
        raise OSError("disk quota exceeded")
    monkeypatch.setattr(ckpt.dcp, "save", crash)
    with pytest.raises(OutputError, match="step_00000002 .*disk quota exceeded.*step_00000001 "
                                          "is the last good checkpoint"):
        saver.save(2, {"w": torch.tensor([2.0])}, {})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
    assert not list(tmp_path.glob(".*partial"))  # its space is given back at once
    state = {"w": torch.zeros(1)}
    saver.load(tmp_path / "step_00000001", state)
    assert state["w"].item() == 1


def test_a_ctrl_c_in_the_middle_of_a_write_stays_an_interrupt(tmp_path, monkeypatch):
    """torch's zip writer, interrupted by Ctrl-C, raises its own RuntimeError over the
    KeyboardInterrupt ("unexpected pos 642 vs 598"), which DCP wraps: the run reported an
    internal error instead of exit 130 (a full suite's Ctrl-C at 3.0 s of start-up met a
    save). The interrupt comes through; the half-written folder goes."""
    from torch.distributed.checkpoint.api import CheckpointException

    saver = checkpointer(tmp_path)
    saver.save(1, {"w": torch.tensor([1.0])}, {})

    def interrupted(state, checkpoint_id, process_group):
        (Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"half a shard")
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected "
                                   "pos 642 vs 598")
        except RuntimeError as err:
            raise CheckpointException("save", {0: (err, None)})
    monkeypatch.setattr(ckpt.dcp, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        saver.save(2, {"w": torch.tensor([2.0])}, {})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
    assert not list(tmp_path.glob(".*partial"))


def test_loading_refuses_arbitrary_objects(tmp_path):
    saver = checkpointer(tmp_path)
    saver.save(1, {"w": torch.tensor([1.0])}, {})
    torch.save({"evil": print}, tmp_path / "step_00000001" / "rng_rank0.pt")
    with pytest.raises(Exception, match="[Ww]eights only"):
        saver.load(tmp_path / "step_00000001", {"w": torch.zeros(1)})
