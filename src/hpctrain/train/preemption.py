"""Stop in time: a signal or the job's deadline becomes a checkpoint at the next step boundary.

A signal handler only sets a flag: saving inside the handler can deadlock (it may interrupt a
collective or the allocator). At each step boundary the ranks agree on the flags with one
small all-reduce on the CPU-side gloo group, so a signal that reached a single rank stops all
of them at the same step, which they then checkpoint together. The loop then raises
`Preempted` (exit code 75) and, under Slurm, rank 0 asks for a requeue.

The deadline needs no signal at all: the job's end time (or a given time) minus a safety
margin. Signals can be lost (a batch script without `exec`, a container); the clock cannot.

SIGTERM also saves and stops, but asks for no requeue: it is what `scancel` sends, and what
Slurm sends when it preempts and requeues a job by itself.

`catch_early` holds the stop signals from the first moment of `hpctrain run`, before torch is
even imported (seconds): without it a signal in that window would kill the process with
nothing said; the Stopper takes over what came meanwhile. In hpctrain's own process
(`until_exit`), once the run has ended a stop signal has nothing left to stop: the Stopper
leaves them ignored, so a signal after the summary is written cannot turn exit 0 (or 75) into
death by signal.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: catch_early must come before any heavy import
    from hpctrain.config import PreemptionConfig

# Agreed by the largest code over ranks: a requeue request outweighs a bare SIGTERM.
STOP, REQUEUE_SIGNAL, DEADLINE = 1, 2, 3
EARLY_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")  # SIGTERM and the usual preemption notices

_early_previous: dict[int, object] = {}
_early_received: list[int] = []
_until_exit = False  # hpctrain's own process: stop signals stay ignored once the run has ended


def catch_early(names: tuple[str, ...] = EARLY_SIGNALS, until_exit: bool = False) -> None:
    """Record the stop signals from now on, until a Stopper takes them over; `until_exit`:
    this process ends with the run, and stop signals after it are ignored."""
    global _until_exit
    _until_exit = until_exit
    for name in names:
        number = getattr(signal, name)
        _early_previous.setdefault(number, signal.signal(number, _record_early))


def _record_early(number, frame) -> None:
    _early_received.append(number)


def release_early() -> None:
    """End catch_early when no Stopper took over (the run never started): put the handlers
    back and let what came meanwhile do what it would have done."""
    for number in _release_early():
        signal.raise_signal(number)


def _release_early() -> list[int]:
    """Put back the handlers catch_early replaced; the signals it recorded meanwhile."""
    for number, handler in _early_previous.items():
        signal.signal(number, handler)
    _early_previous.clear()
    received = list(_early_received)
    _early_received.clear()
    return received


def _interrupt_once(number, frame) -> None:
    """Ctrl-C stops at once (KeyboardInterrupt: exit 130, the last checkpoint kept). A second
    one while the run winds down (its summary written, its loader's workers joined) is
    ignored: it would break that off with a KeyboardInterrupt traceback from wherever it
    landed (a worker's join, a DataLoader's __del__, torch's exit hooks)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def deadline_at(cfg: PreemptionConfig, job_end: float | None,
                now: float | None = None) -> float | None:
    """When to stop: the end (the job's, for 'auto') minus the margin; None for no deadline.
    A job shorter than ten margins keeps a tenth of its remaining time as margin instead, so
    a short job still trains."""
    if cfg.deadline is None:
        return None
    end = job_end if cfg.deadline == "auto" else cfg.deadline
    if end is None:
        return None
    remaining = end - (time.time() if now is None else now)
    return end - min(cfg.deadline_margin_seconds, max(remaining, 0.0) / 10)


class Stopper:
    """Collects stop requests and turns them into one agreed decision per step."""

    def __init__(self, distributed=None, deadline: float | None = None):
        self.dist = distributed
        self.deadline = deadline
        self.requeue_signal = "SIGUSR1"
        self.signalled: str | None = None
        self.signalled_at: float | None = None  # monotonic time of the first signal
        self._previous: dict[int, object] = {}

    def attach(self, distributed, deadline: float | None) -> None:
        """The ranks to agree with and the deadline, once the run is built."""
        self.dist, self.deadline = distributed, deadline

    def install(self, requeue_signal: str) -> None:
        """Catch `requeue_signal` (save, stop, requeue) and SIGTERM (save, stop); in
        hpctrain's own process, a Ctrl-C stops at once and a second one is ignored."""
        self.requeue_signal = requeue_signal
        early = _release_early()
        for name in {requeue_signal, "SIGTERM"}:
            number = getattr(signal, name)
            self._previous[number] = signal.signal(number, self._on_signal)
        if _until_exit:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt_once)
        for number in early:  # what came during start-up
            if number in self._previous and number != signal.SIGINT:
                self._on_signal(number, None)
            else:  # a signal this run does not take: what it would have done unheld
                signal.raise_signal(number)

    def _on_signal(self, number, frame) -> None:
        name = signal.Signals(number).name  # only a flag: act at the step boundary
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        if self.signalled != self.requeue_signal:  # a requeue request is not downgraded
            self.signalled = name

    def seconds_since_signal(self) -> float | None:
        """How long ago the first stop signal came (None: none came)."""
        return None if self.signalled_at is None else time.monotonic() - self.signalled_at

    def close(self) -> None:
        """The run has ended: the handlers from before, or in hpctrain's own process none
        (the signals ignored: the exit status stands)."""
        for number, handler in self._previous.items():
            signal.signal(number, signal.SIG_IGN if _until_exit else handler)
        self._previous.clear()

    def check(self) -> tuple[str, bool] | None:
        """(why, whether to requeue) when every rank stops now, else None; collective when
        distributed."""
        local = 0
        if self.deadline and time.time() >= self.deadline:
            local = DEADLINE
        elif self.signalled:
            local = REQUEUE_SIGNAL if self.signalled == self.requeue_signal else STOP
        agreed = self.dist.any(local) if self.dist is not None else local
        if agreed == DEADLINE:
            return "the time limit is near", True
        if agreed == REQUEUE_SIGNAL:
            return f"{self.requeue_signal} received", True
        if agreed == STOP:
            return "SIGTERM received", False
        return None
