"""Atomic checkpoints, resume=auto, and resumed runs that end bitwise equal: the tests that
train, in this process or in an `hpctrain` process of their own (the others are
tests/unit/test_checkpoint.py)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from training_state import assert_same_training_state, final_state

from hpctrain.runs.directory import list_checkpoints

DETERMINISTIC = ("deterministic=true", "train.epochs=10", "checkpoint.every_steps=5",
                 "checkpoint.keep_last=30", "data.num_workers=1", "optim.ema.enabled=true")


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
