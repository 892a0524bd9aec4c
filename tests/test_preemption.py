"""Stopping in time: signals become a flag, the deadline needs no signal, exit status 75."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.cluster.environment import detect
from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.train.checkpoint import list_checkpoints
from hpctrain.train.parallel import Distributed
from hpctrain.train.preemption import Stopper, deadline_at


def single() -> Distributed:
    return Distributed(detect({}), "none", hosts=("here",))


def test_a_signal_only_sets_a_flag_read_at_the_step_boundary():
    before = signal.getsignal(signal.SIGUSR1)
    stopper = Stopper(single())
    stopper.install("SIGUSR1")
    try:
        assert stopper.check() is None
        os.kill(os.getpid(), signal.SIGTERM)  # scancel: save and stop, no requeue
        assert stopper.check() == ("SIGTERM received", False)
        os.kill(os.getpid(), signal.SIGUSR1)  # the preemption notice: save, stop, requeue
        assert stopper.check() == ("SIGUSR1 received", True)
        os.kill(os.getpid(), signal.SIGTERM)  # a later SIGTERM does not cancel the requeue
        assert stopper.check() == ("SIGUSR1 received", True)
    finally:
        stopper.close()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_deadline_is_the_end_minus_the_margin():
    cfg = load_config("default", ["preemption.deadline=2026-11-22T18:00:00",
                                  "preemption.deadline_margin_seconds=600"]).preemption
    end = time.mktime((2026, 11, 22, 18, 0, 0, 0, 0, -1))
    assert deadline_at(cfg, None, now=end - 86400) == end - 600
    auto = load_config("default", []).preemption  # margin 300 s
    assert deadline_at(auto, 10000.0, now=0.0) == 9700.0
    assert deadline_at(auto, 1000.0, now=700.0) == 970.0  # a short job: a tenth as margin
    assert deadline_at(auto, None) is None
    assert load_config("default", ["preemption.deadline=1900000000"]).preemption.deadline == \
        1900000000.0
    with pytest.raises(ConfigError, match="preemption.deadline.*is not a time"):
        load_config("default", ["preemption.deadline=tomorrow"])


def test_the_deadline_saves_and_exits_with_the_requeue_status(tmp_path, run_cli, tiny,
                                                              monkeypatch):
    """Inside a Slurm job whose client commands are missing (a container): no requeue, the
    exit status tells the batch script."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol, no squeue
    code, _, err = run_cli("run", "default", *tiny(
        "train.max_steps=100000", "train.log_every=50", "run_name=limited",
        f"preemption.deadline={time.time() + 3}", "preemption.deadline_margin_seconds=0"))
    assert code == 75
    assert "the time limit is near" in err and "scontrol is not available" in err
    run = tmp_path / "runs" / "limited"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["steps"] < 100000
    assert list_checkpoints(run / "checkpoints")[-1].name == f"step_{summary['steps']:08d}"
    code, out, _ = run_cli("run", "default", *tiny(
        "train.max_steps=" + str(summary["steps"] + 3), "run_name=limited", "resume=auto",
        "preemption.deadline=null"))
    assert code == 0 and "resuming" in out
    assert json.loads((run / "summary.json").read_text())["restarts"] == 1


def test_a_signal_to_the_whole_process_group_spares_the_data_workers(tmp_path, tiny):
    """Slurm signals every process of a step, DataLoader workers included: they must not die
    of it (SIGUSR1's default action), and the run must still stop cleanly with 75."""
    run = tmp_path / "runs" / "grouped"
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "run", "default", *tiny(
            "data.num_workers=1", "train.max_steps=100000", "train.log_every=5",
            "run_name=grouped")],
        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 3):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    workers = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    assert workers, "the run should have DataLoader workers"
    os.killpg(process.pid, signal.SIGUSR1)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 75, err[-2000:]
    assert "SIGUSR1 received" in err and "exited unexpectedly" not in err
