"""Stop in time: a signal or the job's deadline becomes a checkpoint at the next step boundary.

A signal handler only sets a flag: saving inside the handler can deadlock (it may interrupt a
collective or the allocator). At each step boundary the ranks agree on the flags with one
small all-reduce on the CPU-side gloo group, so a signal that reached a single rank stops all
of them at the same step, which they then checkpoint together. The loop then raises
`Preempted` (exit code 75) and, under Slurm, rank 0 asks for a requeue.

The deadline needs no signal at all: the job's end time (or a given time) minus a safety
margin. Signals can be lost (a batch script without `exec`, a container); the clock cannot.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime

from hpctrain.config import PreemptionConfig
from hpctrain.errors import ConfigError

REASONS = {1: "a stop signal", 2: "the time limit"}


def parse_deadline(text: str) -> float:
    """A time as Unix seconds or ISO 8601 (local time unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ConfigError(f"preemption.deadline={text!r} is not a time: give Unix seconds, an "
                          "ISO time such as 2026-11-22T18:00, 'auto' or null") from None


def deadline_at(cfg: PreemptionConfig, job_end: float | None) -> float | None:
    """When to stop: the end (the job's, for 'auto') minus the margin; None for no deadline."""
    if cfg.deadline is None:
        return None
    end = job_end if cfg.deadline == "auto" else parse_deadline(cfg.deadline)
    return None if end is None else end - cfg.deadline_margin_seconds


class Stopper:
    """Collects stop requests and turns them into one agreed decision per step."""

    def __init__(self, distributed, deadline: float | None = None):
        self.dist = distributed
        self.deadline = deadline
        self.signalled: str | None = None
        self._previous: dict[int, object] = {}

    def install(self, signal_names: list[str]) -> None:
        for name in signal_names:
            number = getattr(signal, name)
            self._previous[number] = signal.signal(number, self._on_signal)

    def _on_signal(self, number, frame) -> None:
        self.signalled = signal.Signals(number).name  # only a flag: act at the step boundary

    def close(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def check(self) -> str | None:
        """The reason every rank stops now, or None; collective when distributed."""
        local = 1 if self.signalled else 2 if self.deadline and time.time() >= self.deadline \
            else 0
        agreed = self.dist.any(local)
        if not agreed:
            return None
        if self.signalled:
            return f"{self.signalled} received"
        return REASONS[agreed] + (" reached" if agreed == 2 else " on another rank")
