"""How often to checkpoint, from what a checkpoint costs and how often a run is stopped
without a word (issue 55, item 3).

Between two checkpoints `interval` seconds of training apart, a save blocks the training for
`save` seconds; a stop that gives no warning (a node lost, the OOM killer, kill -9; a time
limit's stop signal saves where it lands and costs nothing) loses the training since the last
checkpoint, on average half an interval, and a restart. Young (1974) minimised the expected
waste of the two, `save / interval + interval / (2 * mtbf)`, at sqrt(2 * save * mtbf); Daly
(2006) refined it for saves that are not small against the mean time between stops. The
interval is never shorter than a save itself (a run would do nothing else).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """The training seconds between checkpoints that waste the least, by Daly's higher-order
    formula (Young's sqrt(2 * save * mtbf), corrected); mtbf: the mean time between
    unwarned stops. For saves of half the mean time between stops or more, the mean time
    itself (Daly's bound)."""
    if save_seconds <= 0:
        raise ValueError(f"a save of {save_seconds} s: a save takes some time")
    if save_seconds >= mtbf_seconds / 2:
        return mtbf_seconds
    ratio = save_seconds / (2 * mtbf_seconds)
    best = math.sqrt(2 * save_seconds * mtbf_seconds) * (
        1 + math.sqrt(ratio) / 3 + ratio / 9) - save_seconds
    return max(best, save_seconds)


def expected_waste(interval: float, save_seconds: float, mtbf_seconds: float,
                   restart_seconds: float = 0.0) -> float:
    """Young's first-order estimate of the share of a run's time wasted at `interval`: the
    saves, and per unwarned stop half an interval of training redone and a restart."""
    return save_seconds / interval + (interval / 2 + restart_seconds) / mtbf_seconds


FIRST_SAVE_SECONDS = 600.0  # of training before the first save, whose cost is not known yet


def unwarned_stops(starts: list, now: bool = False) -> tuple[int, float]:
    """(stops without a word, hours trained) of a run's jobs as run.json keeps them: a job
    another start found dead (`lost`), or one whose steps the next start redid (one killed
    right after a save redid none: not counted); `now`: the job before this start died
    without a word (its lock was taken over)."""
    jobs = [start for start in starts if isinstance(start, dict)]
    stops = int(now) + sum(1 for number, start in enumerate(jobs) if start.get("lost") or (
        number + 1 < len(jobs) and jobs[number + 1].get("redone_steps")))
    seconds = sum(start["seconds"] for start in jobs
                  if isinstance(start.get("seconds"), (int, float)))
    return stops, seconds / 3600


@dataclass
class Pacer:
    """When `checkpoint.every=auto` saves: at Daly's interval for the slowest rank's last
    save and the run's rate of unwarned stops (`stops` in `hours`, with a prior of one per
    `prior_hours`),
    in steps of the slowest rank's step time; the first save after FIRST_SAVE_SECONDS of
    training or the epoch's end, whichever comes first. Never longer than the job has until
    its deadline (`limit` seconds; the time limit itself is the stop signal's, no failure).
    Every rank decides alike: `update` takes figures gathered from every rank."""

    stops: int
    hours: float
    steps_per_epoch: int
    prior_hours: float  # one unwarned stop per this many hours (checkpoint.prior_stop_hours)
    limit: float | None = None
    save_seconds: float | None = None
    step_seconds: float | None = None
    interval: int = 0  # steps between saves (0: until the epoch's end)
    last: int = 0  # the step of the last save

    @property
    def mtbf_seconds(self) -> float:
        return 3600 * (self.hours + self.prior_hours) / (self.stops + 1)

    def saves(self, step: int) -> bool:
        """Whether `step` saves (the interval then counts from it)."""
        interval = self.interval or self.steps_per_epoch
        due = step - self.last >= interval or (self.save_seconds is None and
                                               step % self.steps_per_epoch == 0)
        if due:
            self.last = step
        return due

    def update(self, step_seconds: float, save_seconds: float | None) -> None:
        """The interval again, from the step time and the last save's blocking time (None:
        none measured since)."""
        self.step_seconds = step_seconds
        if save_seconds:
            self.save_seconds = save_seconds
        seconds = daly_interval(self.save_seconds, self.mtbf_seconds) if self.save_seconds \
            else FIRST_SAVE_SECONDS
        if self.limit:
            seconds = min(seconds, self.limit)
        self.interval = max(1, round(seconds / step_seconds)) if step_seconds > 0 else 0

    def describe(self) -> dict:
        """The interval and what it was chosen from (summary.json's checkpoint_interval)."""
        return {"steps": self.interval or None,
                "seconds": self.interval * self.step_seconds
                if self.interval and self.step_seconds else None,
                "save_seconds": self.save_seconds, "mtbf_hours": self.mtbf_seconds / 3600,
                "unwarned_stops": self.stops, "run_hours": self.hours,
                "prior": f"one unwarned stop per {self.prior_hours:g} h"}
