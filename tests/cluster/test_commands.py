"""The one runner of external commands (hpctrain/commands.py), against commands the tests
write: one that prints without end is stopped at the cap in a child whose address space is
limited (before, `capture_output` kept it all: 3.8 GB), one that keeps printing slowly is
stopped at its deadline with its whole process group, and the scheduler's seam says either
in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from hpctrain.commands import OutputTooLarge, run_command, run_shown

LIMITED = textwrap.dedent("""\
    import resource, subprocess, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # unguarded: the machine's
    from hpctrain.cluster import slurm
    from hpctrain.cluster.records import ClusterError
    try:
        slurm.run(sys.argv[1:])
    except ClusterError as err:
        print(err)
    """)


def _fake(folder, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


@pytest.mark.parametrize("command", [["sacct", "-n", "-P", "-j", "1"], ["squeue", "-h"],
                                     ["sbatch", "--parsable", "job.sbatch"]])
def test_a_command_that_prints_without_end_is_one_line_in_bounded_memory(tmp_path, command):
    _fake(tmp_path, command[0], "yes 'a line of a scheduler that never ends'")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", LIMITED, *command], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == [
        f"{command[0]} printed more than 200,000 lines and was stopped: more than a "
        f"scheduler's answer; is '{command[0]}' on PATH the scheduler's own?"]
    assert time.monotonic() - started < 60


def test_a_command_past_its_deadline_is_killed_with_its_children(tmp_path):
    """It keeps printing (a timeout checked between reads never fires) and has a child of
    its own: both are gone when the deadline is said."""
    pids = tmp_path / "pids"
    _fake(tmp_path, "slow", f"sleep 300 & echo $! > {pids}\n"
                            "while true; do echo waiting; sleep 0.05; done")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_command([str(tmp_path / "slow")], 2, most_lines=10**9)
    assert 1.9 < time.monotonic() - started < 10
    child = int(pids.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_watched_command_past_its_deadline_is_killed_with_its_children(tmp_path, capfd):
    """`wandb sync` runs with its output on the terminal (run_shown): past its deadline it is
    killed with its child, where it could wait on the network without end."""
    pids = tmp_path / "pids"
    _fake(tmp_path, "sync", f"sleep 300 & echo $! > {pids}\necho syncing\nwait")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_shown([str(tmp_path / "sync")], 2)
    assert 1.9 < time.monotonic() - started < 10 and "syncing" in capfd.readouterr().out
    child = int(pids.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    _fake(tmp_path, "done", "exit 4")
    assert run_shown([str(tmp_path / "done")], 30) == 4


def test_output_is_capped_in_bytes_and_read_as_text(tmp_path):
    _fake(tmp_path, "wide", "head -c 3000000 /dev/zero | tr '\\0' 'x'")
    with pytest.raises(OutputTooLarge, match="printed more than 1 MiB"):
        run_command([str(tmp_path / "wide")], 30, most_bytes=1 << 20)
    _fake(tmp_path, "mixed", "printf 'ok\\xff\\n'; echo said >&2; exit 3")
    done = run_command([str(tmp_path / "mixed")], 30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "ok\ufffd\n", "said\n")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "\nState:\tZ" not in status.read()
    except OSError:
        return False
