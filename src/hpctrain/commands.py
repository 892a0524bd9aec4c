"""The one door for external commands whose output hpctrain reads (the scheduler's, git,
py-spy, a job's python), and for those whose output the user watches (`wandb sync`): a deadline that holds while the command keeps printing, its output
capped in bytes and lines, and its whole process group killed past either.

`subprocess.run(..., capture_output=True, timeout=...)` keeps everything the command prints
and checks its timeout only between reads: a scheduler's accounting command that printed
without end took `hpctrain goodput` to 3.8 GB, its 120 s timeout never firing. Here the output is read as it comes,
in a process group of its own, and a command past its deadline or its cap is killed with its
children. The errors are subprocess's own kinds (`subprocess.TimeoutExpired`, and
`OutputTooLarge`, a `subprocess.SubprocessError`), so a caller's handling of a command that
failed covers them.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

MOST_BYTES = 16 << 20  # far above any answer hpctrain reads from a command
MOST_LINES = 200_000
READ_BYTES = 1 << 16
REAP_SECONDS = 5.0  # a killed group's leader is waited for this long, then left


class OutputTooLarge(subprocess.SubprocessError):
    """A command printed more than the cap: killed, its output not kept."""

    def __init__(self, args: Sequence[str], limit: str):
        super().__init__(f"{Path(args[0]).name} printed more than {limit} and was stopped")
        self.cmd, self.limit = list(args), limit


def run_command(args: Sequence[str], timeout: float, *, cwd=None,
                env: Mapping[str, str] | None = None, most_bytes: int = MOST_BYTES,
                most_lines: int = MOST_LINES) -> subprocess.CompletedProcess:
    """Run `args`, its stdout and stderr read as text (undecodable bytes replaced), within
    `timeout` seconds in all; raise subprocess.TimeoutExpired past it, OutputTooLarge past
    `most_bytes` or `most_lines` of output (both streams together), the command's group
    killed first either way. OSError where it cannot start (not found, not executable)."""
    child = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True,
                             env=None if env is None else dict(env))
    deadline = time.monotonic() + timeout
    try:
        out, err = _read(child, args, deadline, timeout, most_bytes, most_lines)
        # its streams closed, it may still run: within the same deadline
        returncode = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except BaseException:  # the deadline, the cap, or a Ctrl-C: nothing of it left running
        _kill_group(child)
        raise
    finally:
        child.stdout.close()
        child.stderr.close()
    return subprocess.CompletedProcess(list(args), returncode, _text(out), _text(err))


def run_shown(args: Sequence[str], timeout: float) -> int:
    """Run `args` with its output on hpctrain's own (a long command the user watches: `wandb
    sync`), within `timeout` seconds; its exit status. Past the deadline, or at a Ctrl-C, its
    whole process group is killed (subprocess.TimeoutExpired, KeyboardInterrupt)."""
    child = subprocess.Popen(list(args), stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return child.wait(timeout=timeout)
    except BaseException:
        _kill_group(child)
        raise


def _read(child: subprocess.Popen, args, deadline: float, timeout: float, most_bytes: int,
          most_lines: int) -> tuple[list[bytes], list[bytes]]:
    """Both streams to their end, checking the deadline and the caps at every chunk."""
    chunks: dict[int, list[bytes]] = {child.stdout.fileno(): [], child.stderr.fileno(): []}
    read = lines = 0
    with selectors.DefaultSelector() as selector:
        for stream in (child.stdout, child.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(list(args), timeout)
            for key, _ in selector.select(timeout=min(left, 1.0)):
                chunk = os.read(key.fd, READ_BYTES)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                read, lines = read + len(chunk), lines + chunk.count(b"\n")
                if read > most_bytes:
                    raise OutputTooLarge(args, f"{most_bytes >> 20} MiB")
                if lines > most_lines:
                    raise OutputTooLarge(args, f"{most_lines:,} lines")
                chunks[key.fd].append(chunk)
    return chunks[child.stdout.fileno()], chunks[child.stderr.fileno()]


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode(errors="replace")


def _kill_group(child: subprocess.Popen) -> None:
    """SIGKILL to the command's process group (its children with it), then reaped."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        child.wait(timeout=REAP_SECONDS)
    except subprocess.TimeoutExpired:
        pass  # unkillable (a process in uninterruptible sleep): not waited for forever
