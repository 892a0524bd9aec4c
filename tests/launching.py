"""Runs in processes of their own, as the tests start and watch them: `hpctrain run` alone or
under torchrun, its records read back, a torchrun worker found by its rank, a step waited
for."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def one_thread_env(**extra: str) -> dict[str, str]:
    """This process's environment with one OpenMP thread per process, as torchrun sets for its
    workers (two processes of two threads each thrash two cores); a warm torchrun agent forks
    its workers only where their start-up variables are its own, so set it for the agent too."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def launch(nproc: int, overrides: list[str], timeout: float = 240,
           recipe: str = "default") -> subprocess.CompletedProcess:
    if nproc == 1:
        command = [sys.executable, "-m", "hpctrain", "run", recipe, *overrides]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", "-m", "hpctrain", "run", recipe, *overrides]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=one_thread_env())


def limited(*args: str, size: int = 4 << 30, env: dict | None = None,
            timeout: float = 300) -> tuple[int, str, str]:
    """`hpctrain ARGS` in a child of `size` bytes of address space: a broken defence that
    reads or allocates without bound fails there, not on the machine. (code, stdout, stderr)"""
    from warm_starts import AddressSpaceLimit

    done = subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})},
                          preexec_fn=AddressSpaceLimit(size))
    return done.returncode, done.stdout, done.stderr


def run_ok(nproc, overrides) -> Path:
    done = launch(nproc, overrides)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    name = next(o.split("=", 1)[1] for o in overrides if o.startswith("run_name="))
    return Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("output_dir="))) / name


def records(run: str | Path, kind: str) -> list[dict]:
    """The run's metrics.jsonl records of this kind ("train", "eval", ...)."""
    rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


def worker_pid(agent: int, rank: int, nproc: int = 2, timeout: float = 60) -> int:
    """The pid of the worker with local rank `rank` of a torchrun agent on `nproc` processes:
    the agent starts them in rank order, so the rank-th pid once all are there (a worker forked
    from a warm agent shows the warm process's environment in /proc, not its RANK)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = sorted(children(agent))
        if len(workers) == nproc:
            return workers[rank]
        time.sleep(0.05)
    raise AssertionError(f"torchrun's {nproc} workers never all started")


def wait_for_step(run: Path, step: int, process: subprocess.Popen, timeout: float = 120):
    deadline = time.monotonic() + timeout
    metrics = run / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it was signalled"
        if metrics.exists() and any(r["step"] >= step for r in records(run, "train")):
            return
        time.sleep(0.01)
    raise AssertionError(f"step {step} never logged")


def start_run(tiny, *extra: str) -> subprocess.Popen:
    """`hpctrain run` in a process group of its own (its DataLoader workers in it too)."""
    return subprocess.Popen([sys.executable, "-m", "hpctrain", "run", "default", *tiny(*extra)],
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(condition, process, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
