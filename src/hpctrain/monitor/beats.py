"""Progress beats: the phase a process is in and since when, and how long a phase may go on.

The training loop beats at every step, every evaluation batch, every part of a save and each
stage of the start-up; each beat ends the phase under way, whose length the bound learns
from. A phase that goes on past its bound is a hang (hangs.py watches). A beat costs a few
attribute writes and one append: nothing waits, nothing is read from the device.

The bound of a phase (`Beats.bound`): during start-up, and for the first of each phase in
this process (the first step compiles, the first evaluation batch starts the workers, the
first save plans its layout), `monitor.hang_startup_seconds`; afterwards `monitor.hang_after`
seconds, or with `auto` 20 times the median of that phase's recent lengths, never under
`monitor.hang_floor_seconds`.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

STARTUP = "start-up"
STEP = "step"
EVALUATION = "evaluation"
CHECKPOINT = "checkpoint"
CLOSING = "closing"
FACTOR = 20  # auto: a phase this many times its median length is not a slow one
HISTORY = 64  # lengths kept per phase


class Beats:
    """One process's progress: the phase under way (`phase`, e.g. "step" or "start-up: the
    data"), since when (monotonic seconds), the steps trained when it began, and the lengths
    of the phases ended so far."""

    def __init__(self):
        self.phase = STARTUP
        self.since = time.monotonic()
        self.step: int | None = None
        self._lengths: dict[str, deque] = {}

    def beat(self, phase: str, step: int | None = None) -> None:
        """The phase under way ended; `phase` begins (`step`: the steps trained by then,
        where it says)."""
        now = time.monotonic()
        lengths = self._lengths.get(self.phase)
        if lengths is None:
            lengths = self._lengths[self.phase] = deque(maxlen=HISTORY)
        lengths.append(now - self.since)
        self.phase, self.since = phase, now
        if step is not None:
            self.step = step

    def silent(self, now: float | None = None) -> float:
        """Seconds since the last beat."""
        return (time.monotonic() if now is None else now) - self.since

    def bound(self, settings) -> float | None:
        """How long the phase under way may last (`settings`: the recipe's monitor
        section); None: no bound (monitor.hang_after=off)."""
        if settings.hang_after == "off":
            return None
        lengths = self._lengths.get(self.phase)
        if self.phase.startswith(STARTUP) or not lengths:
            return settings.hang_startup_seconds
        if settings.hang_after != "auto":
            return float(settings.hang_after)
        return max(settings.hang_floor_seconds, FACTOR * statistics.median(list(lengths)))

    def bound_setting(self, settings) -> str:
        """The setting that bounds the phase under way (for the line that names a hang)."""
        if self.phase.startswith(STARTUP) or not self._lengths.get(self.phase):
            return "monitor.hang_startup_seconds"
        return "monitor.hang_after" if settings.hang_after != "auto" else \
            f"monitor.hang_after=auto: {FACTOR} times its median, at least " \
            "monitor.hang_floor_seconds"

    def typical(self, phase: str) -> float | None:
        """The median length of `phase` so far (None: none ended yet)."""
        lengths = self._lengths.get(phase)
        return statistics.median(list(lengths)) if lengths else None
