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
"""

from __future__ import annotations

import signal
import time

from hpctrain.config import PreemptionConfig

# Agreed by the largest code over ranks: a requeue request outweighs a bare SIGTERM.
STOP, REQUEUE_SIGNAL, DEADLINE = 1, 2, 3


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
        self._previous: dict[int, object] = {}

    def attach(self, distributed, deadline: float | None) -> None:
        """The ranks to agree with and the deadline, once the run is built."""
        self.dist, self.deadline = distributed, deadline

    def install(self, requeue_signal: str) -> None:
        """Catch `requeue_signal` (save, stop, requeue) and SIGTERM (save, stop)."""
        self.requeue_signal = requeue_signal
        for name in {requeue_signal, "SIGTERM"}:
            number = getattr(signal, name)
            self._previous[number] = signal.signal(number, self._on_signal)

    def _on_signal(self, number, frame) -> None:
        name = signal.Signals(number).name  # only a flag: act at the step boundary
        if self.signalled != self.requeue_signal:  # a requeue request is not downgraded
            self.signalled = name

    def close(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
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
