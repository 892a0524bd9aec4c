"""The suite's warm starts (tests/warm_starts.py): a `python -m hpctrain` forked from a process
that imported it ends as one started fresh, with the caller's arguments, folder, environment,
standard files and signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import warm_starts
from conftest import child_processes
from launching import one_thread_env, records, wait_for, worker_pid


def _ends(cwd: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def _leads_a_session(pid: int, timeout: float = 30) -> bool:
    """Whether `pid` leads a session of its own within `timeout`: the test may find a worker
    in /proc between its fork and its setsid, warm or cold."""
    deadline = time.monotonic() + timeout
    while os.getsid(pid) != pid:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_warm_start_ends_as_a_cold_one(tmp_path, monkeypatch):
    """Same exit status and output for: a recipe found in the working folder, a variable of
    the caller's environment that hpctrain reads, argparse's own exit, a bad recipe."""
    (tmp_path / "mine.yaml").write_text("train:\n  batch_size: 7\n")
    env = {**os.environ, "HPCTRAIN_EXIT_SECONDS": "nan"}
    cases = [(os.environ, "config", "show", "mine.yaml"), (env, "config", "show", "default"),
             (os.environ, "run", "--no-such-flag"), (os.environ, "run", "nosuch")]
    warm = [_ends(tmp_path, dict(e), *args) for e, *args in cases]
    monkeypatch.setattr(warm_starts.WarmPopen, "cold", True)
    cold = [_ends(tmp_path, dict(e), *args) for e, *args in cases]
    assert warm == cold
    assert "batch_size: 7" in warm[0][1] and warm[1][0] == 2 and "HPCTRAIN_EXIT_SECONDS" in \
        warm[1][2] and warm[2][0] == 2 and warm[3][0] == 2


def test_a_warm_start_is_a_process_of_its_own_that_takes_signals(tmp_path, tiny):
    """Forked by the warm process (not the test's child), in a session of its own when asked:
    a SIGTERM to its group stops the run with the requeue status, as in a cold start."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "run", "default",
         *tiny("run_name=warm", "train.epochs=100", "train.log_every=1")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = tmp_path / "runs" / "warm" / "metrics.jsonl"
    try:
        assert process.pid not in child_processes(os.getpid())
        assert os.getpgid(process.pid) == process.pid  # its own session and group
        wait_for(lambda: metrics.exists() and '"train"' in metrics.read_text(), process)
        os.killpg(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 75, err[-2000:]
    assert "(SIGTERM received)" in err


def test_a_start_limited_in_address_space_is_forked_and_limited_alike(tiny, monkeypatch):
    """The tests' AddressSpaceLimit, the one preexec_fn a forked start takes: the warm start
    runs under the same RLIMIT_AS as a cold one, which exec's preexec_fn set, from the moment
    Popen returns."""
    def limit(expect_forked: bool) -> str:
        process = subprocess.Popen(
            [sys.executable, "-m", "hpctrain", "run", "default",
             *tiny("train.epochs=100", "train.log_every=1")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=warm_starts.AddressSpaceLimit(6 << 30))
        try:
            assert (process.pid not in child_processes(os.getpid())) == expect_forked
            return next(line for line in Path(f"/proc/{process.pid}/limits").read_text()
                        .splitlines() if line.startswith("Max address space"))
        finally:
            process.kill()
            process.wait(timeout=60)

    warm = limit(expect_forked=True)
    monkeypatch.setattr(warm_starts.WarmPopen, "cold", True)
    assert warm == limit(expect_forked=False) and str(6 << 30) in warm


def test_a_warm_torchrun_agent_forks_its_workers_which_train_as_cold_started_ones(
        tmp_path, tiny, monkeypatch):
    """torchrun's workers forked from a warm agent: its children, each in a session of its
    own (torchrun asks that), not started by exec; they train as cold-started workers do,
    step by step, and end the agent alike."""
    def run(name: str) -> tuple[list[bool], list[bool], str, int]:
        agent = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node=2", "-m", "hpctrain", "run", "default",
             *tiny(f"run_name={name}", "train.epochs=4")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=one_thread_env())
        try:
            workers = [worker_pid(agent.pid, rank) for rank in (0, 1)]
            own_session = [_leads_a_session(pid) for pid in workers]
            forked = [b"warm_starts" in Path(f"/proc/{pid}/cmdline").read_bytes()
                      for pid in workers]
            output, _ = agent.communicate(timeout=180)
        finally:
            if agent.poll() is None:
                agent.kill()
        return own_session, forked, output, agent.returncode

    own_session, forked, output, code = run("warm")
    assert code == 0, output[-3000:]
    assert own_session == [True, True] and forked == [True, True]
    monkeypatch.setattr(warm_starts.WarmPopen, "cold", True)
    cold_session, cold_forked, cold_output, cold_code = run("cold")
    assert cold_code == 0, cold_output[-3000:]
    assert cold_session == [True, True] and cold_forked == [False, False]
    losses = {name: [(r["step"], r["loss"]) for r in records(tmp_path / "runs" / name, "train")]
              for name in ("warm", "cold")}
    assert losses["warm"] == losses["cold"] and len(losses["warm"]) >= 10
