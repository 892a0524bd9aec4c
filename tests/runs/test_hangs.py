"""A run that stops making progress is found, named and ended with the exit code that asks for
a requeue (issue 65): six hangs injected where users and machines make them (a loader worker
deadlocked on a lock held at its fork, a worker blocked on a read that never returns, a hook
of the user's that never returns, one of two torchrun ranks stuck before a collective, a
checkpoint write that never returns, an evaluation batch that never comes), each run ending
within its bound with the stacks, the line naming the frame and exit 76; the bounds, the
line and the stacks of a stuck child, unit by unit.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_hangs.py, tests/cluster/test_hangs.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import running

from hpctrain.errors import ExitCode
from hpctrain.monitor import stacks

FIXTURES = Path(__file__).parent.parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from hangs import recipe  # noqa: E402

STUCK_IN_SAVE = str(FIXTURES / "stuck_in_save.py")


def _reader(fifo: str, armed: bool) -> None:
    if armed:
        stacks.arm_in_worker(os.getppid())
    with open(fifo, "rb") as handle:
        handle.read(1)


@pytest.mark.parametrize("tool", ["py-spy", "faulthandler"])
def test_a_worker_blocked_on_a_read_is_named_with_the_file(tmp_path, monkeypatch, tool):
    """py-spy reads its frames from outside; without it, the worker's own faulthandler
    writes them into its memory file on SIGQUIT. /proc names the file it reads."""
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # held open, never written
    child = multiprocessing.get_context("fork").Process(target=_reader, args=(str(fifo), True))
    child.start()
    try:
        if tool == "faulthandler":
            monkeypatch.setenv("PATH", "/nonexistent")
        deadline = time.monotonic() + 20
        while stacks.waiting_on(child.pid) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = stacks.worker_stacks(child.pid, "fork")
        assert seen.tool == tool and seen.armed
        assert seen.where() == f"your code at {__file__}:{_reader.__code__.co_firstlineno + 4}" \
                               f" in {'_reader' if tool == 'faulthandler' else '_reader'}, " \
                               f"reading {fifo}"
        assert "_reader" in seen.text
    finally:
        child.kill()
        child.join()
        os.close(writer)


def test_a_worker_stuck_in_its_fork_is_named_a_fork_deadlock(tmp_path):
    """The child inherits a lock held by another thread at the fork, and an at-fork handler
    takes it before the child's first line as a worker (what CPython's own lock of thread
    states does in gh-112275): it never armed its stacks, and its frames still fork."""
    code = f"""
import multiprocessing, os, sys, threading, time
sys.path.insert(0, {str(Path(stacks.__file__).parents[2])!r})
from hpctrain.monitor import stacks
lock = threading.Lock()
threading.Thread(target=lambda: (lock.acquire(), time.sleep(3600)), daemon=True).start()
time.sleep(0.2)
os.register_at_fork(after_in_child=lock.acquire)
child = multiprocessing.get_context("fork").Process(target=print)
threading.Thread(target=child.start, daemon=True).start()
time.sleep(2)
stuck = multiprocessing.active_children()[0].pid
print(stacks.worker_stacks(stuck, "fork").where(), flush=True)
os.kill(stuck, 9)
os._exit(0)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.startswith("stuck in its fork before its first line of Python: a lock "
                                  "another thread of the training process held when it "
                                  "forked (CPython gh-112275"), done.stdout + done.stderr


# ---- six hangs, each a real run -------------------------------------------------------------

def _run(tmp_path: Path, *overrides: str, script: str | None = None, metric: bool = False,
         timeout: float = 180) -> tuple[subprocess.CompletedProcess, Path]:
    """`hpctrain run` of the hangs fixture's recipe: (process, its run directory)."""
    command = [sys.executable, script] if script else [sys.executable, "-m", "hpctrain"]
    done = subprocess.run([*command, "run", str(recipe(tmp_path, metric=metric)), *overrides],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HANGS_STUCK_AT": "9"})
    run_dir, = (tmp_path / "runs").iterdir()
    return done, run_dir


def _hung(done: subprocess.CompletedProcess, run_dir: Path, code: int = ExitCode.HUNG,
          ranks: int = 1) -> str:
    """The run ended as a hang: `code`, the verdict within its bound, every rank's stacks,
    run.json and summary.json saying so. The verdict's line."""
    assert done.returncode == code, done.stderr[-3000:]
    verdict = json.loads((run_dir / "hang" / "hang.json").read_text())
    assert verdict["line"] in done.stderr
    assert verdict["bound_seconds"] < verdict["silent_seconds"] < \
        verdict["bound_seconds"] + 1.5
    for rank in range(ranks):
        assert "most recent call first" in (run_dir / "hang" / f"rank-{rank}.txt").read_text()
    start = json.loads((run_dir / "run.json").read_text())["starts"][-1]
    assert start["hung"] == verdict["line"] and start["split"]["hung"] > verdict["bound_seconds"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "hung" and summary["hang"] == verdict["line"]
    return verdict["line"]


@pytest.mark.slow
def test_a_worker_deadlocked_on_a_lock_held_at_its_fork_is_found(tmp_path):
    done, run_dir = _run(tmp_path, "data.num_workers=2", "data.kwargs.fork_lock=true",
                         "data.worker_start=fork", "monitor.hang_startup_seconds=4")
    line = _hung(done, run_dir)
    assert "hung in training step 1: no progress for 4 s (bound 4 s, " \
           "monitor.hang_startup_seconds); waits for its loader worker (pid" in line
    assert f"which hangs: your code at {FIXTURES / 'hangs.py'}:" in line
    assert "in Blobs.__getitem__, waiting on a lock (it was forked from the training " \
           "process: a lock another thread held at the fork stays held" in line
    assert "Blobs.__getitem__" in (run_dir / "hang" / "rank-0.txt").read_text()


@pytest.mark.slow
def test_workers_started_by_default_cannot_inherit_that_lock(tmp_path):
    """data.worker_start=auto starts them from the forkserver: the same data trains through."""
    done, run_dir = _run(tmp_path, "data.num_workers=2", "data.kwargs.fork_lock=true",
                         "monitor.hang_startup_seconds=20", "train.epochs=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_a_worker_blocked_on_a_read_that_never_returns_is_found(tmp_path):
    fifo = tmp_path / "stalled-mount"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)
    try:
        done, run_dir = _run(tmp_path, "data.num_workers=2", f"data.kwargs.read={fifo}",
                             "monitor.hang_startup_seconds=4")
    finally:
        os.close(writer)
    line = _hung(done, run_dir)
    assert f"in Blobs.__getitem__, reading {fifo}" in line


@pytest.mark.slow
def test_a_hook_of_yours_that_never_returns_is_found_and_shown(tmp_path, run_cli):
    """And the run's report, goodput and the runs index show it."""
    done, run_dir = _run(tmp_path, metric=True)
    line = _hung(done, run_dir)
    assert line.startswith("hung in training step 9: no progress for 2 s (bound 2 s, "
                           "monitor.hang_after); hangs in your code at ")
    assert "hangs.py:" in line and "in stuck_metric" in line
    code, _, err = run_cli("report", str(run_dir))
    assert code == 0, err
    assert "job 1 hung: hung in training step 9" in (run_dir / "report.html").read_text()
    code, out, err = run_cli("goodput", str(run_dir), "--json")
    assert code == 0, err
    assert json.loads(out)["device_seconds"]["hung"] > 2
    code, out, err = run_cli("runs", "--db", str(tmp_path / "index.sqlite"), "--json",
                             "--root", str(tmp_path / "runs"))
    assert code == 0, err
    assert [row["status"] for row in json.loads(out) if str(tmp_path) in json.dumps(row)] \
        == ["hung"]


@pytest.mark.slow
def test_a_checkpoint_write_that_never_returns_is_found(tmp_path):
    done, run_dir = _run(tmp_path, "checkpoint.every_steps=4", script=STUCK_IN_SAVE)
    line = _hung(done, run_dir)
    assert line.startswith("hung in the checkpoint of step 8: ")
    assert "step_00000004 is kept" in done.stderr


@pytest.mark.slow
def test_an_evaluation_batch_that_never_comes_is_found_and_past_the_limit_ends_the_run(
        tmp_path):
    """With monitor.hang_requeues=0 the first hang is one too many: exit 1, said."""
    done, run_dir = _run(tmp_path, "data.num_workers=2", "data.kwargs.eval_stall=true",
                         "monitor.hang_startup_seconds=4", "monitor.hang_requeues=0")
    line = _hung(done, run_dir, code=ExitCode.FAILED)
    assert line.startswith("hung in an evaluation batch (after step 16): ")
    assert "waits for its loader worker" in line and "in _forever" in line
    assert "the run hung 1 times (monitor.hang_requeues=0): not requeued" in done.stderr


LEFT_RUNNING = """
import atexit, threading
threading.Thread(target=threading.Event().wait, name="not a daemon").start()
atexit.register(threading.Event().wait)  # an exit function that never returns
import torch
class Net(torch.nn.Linear):
    def __init__(self):
        super().__init__(16, 4)
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        if self.calls == 5:
            raise ValueError("a bug in the model's forward")
        return super().forward(x)
"""


@pytest.mark.slow
def test_an_internal_error_ends_the_process_though_a_thread_is_left_running(tmp_path):
    """Before, the interpreter waited for the thread, and an exit function, for good (the
    H200's compile workers held a failed run 55 s and more)."""
    (tmp_path / "leftover.py").write_text(LEFT_RUNNING)
    done = subprocess.run([sys.executable, "-m", "hpctrain", "run", str(recipe(tmp_path)),
                           f"model.name={tmp_path / 'leftover.py'}:Net"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HPCTRAIN_EXIT_SECONDS": "2"})  # not 15 s here
    assert done.returncode == ExitCode.INTERNAL, done.stderr[-2000:]
    assert "ValueError: a bug in the model's forward" in done.stderr
    assert json.loads(next((tmp_path / "runs").glob("*/summary.json")).read_text())[
        "status"] == "failed"  # its records written first
    assert "hpctrain: the process did not end within 2 s of its verb (its exit functions " \
           "waited on threads or child processes): ended" in done.stderr


STARTER = """
import subprocess, sys, time
from hpctrain.monitor import lifeline
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**__import__("os").environ,
                         **lifeline.environment()})
print(child.pid, flush=True)
time.sleep(3600)
"""
FOLLOWER = """
import time
from hpctrain.monitor.lifeline import follow_starter
follow_starter()
time.sleep(3600)
"""


def test_a_child_hpctrain_started_ends_when_its_starter_is_killed():
    """What autotune's trials, a search's and a scaling study's runs do: a SIGKILL of their
    starter left them training on."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER, FOLLOWER],
                               stdout=subprocess.PIPE, text=True)
    child = int(starter.stdout.readline())
    starter.kill()
    starter.wait()
    deadline = time.monotonic() + 30
    while running(child):
        assert time.monotonic() < deadline, "the child outlived its starter"
        time.sleep(0.05)
