"""Atomic checkpoints, resume=auto, and resumed runs that end bitwise equal."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from training_state import assert_same_training_state, final_state

from hpctrain.cluster.environment import detect
from hpctrain.errors import OutputError
from hpctrain.parallel.processes import Distributed
from hpctrain.runs.directory import list_checkpoints
from hpctrain.train.checkpoints import checkpoint as ckpt
from hpctrain.train.checkpoints.checkpoint import Checkpointer

DETERMINISTIC = ("deterministic=true", "train.epochs=10", "checkpoint.every_steps=5",
                 "checkpoint.keep_last=30", "data.num_workers=1", "optim.ema.enabled=true")


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


def test_loading_refuses_arbitrary_objects(tmp_path):
    saver = checkpointer(tmp_path)
    saver.save(1, {"w": torch.tensor([1.0])}, {})
    torch.save({"evil": print}, tmp_path / "step_00000001" / "rng_rank0.pt")
    with pytest.raises(Exception, match="[Ww]eights only"):
        saver.load(tmp_path / "step_00000001", {"w": torch.zeros(1)})


def test_resume_from_a_mid_epoch_checkpoint_ends_bitwise_equal(tmp_path, run_cli, tiny):
    overrides = tiny(*DETERMINISTIC)
    assert run_cli("run", "default", *overrides, "run_name=full")[0] == 0
    full = tmp_path / "runs" / "full"
    resumed = tmp_path / "runs" / "resumed"
    shutil.copytree(full, resumed)
    for path in list_checkpoints(resumed / "checkpoints"):
        if int(path.name.split("_")[1]) > 15:  # 10 steps per epoch: 15 is mid-epoch
            shutil.rmtree(path)
    (resumed / "summary.json").unlink()
    with open(resumed / "metrics.jsonl", "a") as metrics:
        metrics.write('{"kind": "train", "st')  # a line torn by the crash
    code, out, _ = run_cli("run", "default", *overrides, "run_name=resumed", "resume=auto")
    assert code == 0 and "resuming step_00000015" in out
    assert_same_training_state(final_state(full), final_state(resumed))
    rows = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] == 100  # each once
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 100


@pytest.mark.slow
def test_a_killed_run_resumed_ends_bitwise_equal(tmp_path, run_cli, tiny):
    overrides = tiny(*DETERMINISTIC)
    assert run_cli("run", "default", *overrides, "run_name=reference")[0] == 0
    run_dir = tmp_path / "runs" / "killed"
    process = subprocess.Popen([sys.executable, "-m", "hpctrain", "run", "default", *overrides,
                                "run_name=killed"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "step_00000010" / "meta.json").exists():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (run_dir / "summary.json").exists(), "the run finished before it was killed"
    killed_at = list_checkpoints(run_dir / "checkpoints")[-1]
    assert int(killed_at.name.split("_")[1]) < 100
    code, out, _ = run_cli("run", "default", *overrides, "run_name=killed", "resume=auto")
    assert code == 0 and f"resuming {killed_at.name}" in out
    assert_same_training_state(final_state(tmp_path / "runs" / "reference"),
                               final_state(run_dir))


def test_resume_auto_continues_the_newest_run_and_is_idempotent(tmp_path, run_cli, tiny):
    code, out, _ = run_cli("run", "default", *tiny("resume=auto"))
    assert code == 0 and "resuming" not in out  # nothing to continue: a fresh run
    first = next((tmp_path / "runs").iterdir())
    finished = (first / "summary.json").read_bytes()
    code, out, _ = run_cli("run", "default", *tiny("resume=auto"))
    assert code == 0 and f"run {first} is already complete (step 10 of 10)" in out
    assert (first / "summary.json").read_bytes() == finished  # left as it was
    assert len(list((tmp_path / "runs").iterdir())) == 1  # no new directory
    code, out, _ = run_cli("run", "default", *tiny("resume=auto", "train.epochs=2"))
    assert code == 0 and "resuming with changed settings: train.epochs: 1.0 -> 2.0" in out
    assert json.loads((first / "summary.json").read_text())["steps"] == 20


def test_resume_errors_and_run_name_collisions(tmp_path, run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny(f"resume={tmp_path / 'nowhere'}"))
    assert code == 2 and "no checkpoint there" in err
    assert run_cli("run", "default", *tiny("run_name=mine"))[0] == 0
    code, _, err = run_cli("run", "default", *tiny("run_name=mine"))
    assert code == 2 and "already holds checkpoints" in err and "resume=auto" in err
