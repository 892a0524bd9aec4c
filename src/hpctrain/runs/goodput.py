"""Where a run's device-seconds went (`hpctrain goodput RUN`), from its run.json: every job
of the run (each start, also one that died without a word) with its seconds, its devices and
its seconds by phase (written at every checkpoint and when the job ends: bookkeeping.Clock),
each start's `redone_steps`, the steps the job before it trained after the checkpoint it
resumed from (counted from the records it forgot, not guessed), and that job's
`redone_seconds`, those steps at its own mean step time, which its seconds include.

The phases of a job's device-seconds (`PHASES`): productive training steps; the steps' wait
for data; evaluation; the part of checkpoint saves the training waited for; start-up
(imports, the build, a resume's load, up to the training loop); work lost to a stop (the
steps redone, at the job's own mean step time: a job killed without a word trained them
after its last record, and the start that does them again adds them to its seconds); the
rest (shutdown, and the logging interval under way at a job's last record). Goodput is
productive over allocated. The wall time between one job's end and the next one's start
(queue, requeue) is told beside, not counted as allocated: no device is held then. Figures
from the scheduler's accounting are not read yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PHASES = ("productive", "data_wait", "evaluation", "checkpoint", "startup", "lost_work",
          "other")
DESCRIBED = {"productive": "training steps", "data_wait": "steps waiting for data",
             "evaluation": "evaluation", "checkpoint": "checkpoint saves (blocking)",
             "startup": "start-up (imports, build, resume's load)",
             "lost_work": "work lost to stops (steps redone)",
             "other": "shutdown, and the rest"}


@dataclass
class Account:
    """A run's device-seconds by phase, its jobs' and between them."""

    jobs: int = 0
    allocated: float = 0.0  # device-seconds of every job
    phases: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    between_jobs: float = 0.0  # wall seconds from a job's end to the next one's start
    unaccounted_jobs: int = 0  # jobs that left no seconds (run.json of an older hpctrain)
    redone_steps: int = 0

    @property
    def goodput(self) -> float | None:
        return self.phases["productive"] / self.allocated if self.allocated else None

    def as_dict(self) -> dict:
        return {"jobs": self.jobs, "allocated_device_seconds": self.allocated,
                "device_seconds": dict(self.phases),
                "shares": {phase: seconds / self.allocated if self.allocated else None
                           for phase, seconds in self.phases.items()},
                "goodput": self.goodput, "between_jobs_seconds": self.between_jobs,
                "redone_steps": self.redone_steps, "jobs_without_seconds":
                self.unaccounted_jobs}


def account(record: dict) -> Account:
    """The account of run.json's `record` (read through runs.identity.read_identity)."""
    starts = [start for start in record.get("starts", []) if isinstance(start, dict)]
    out = Account(jobs=len(starts))
    for number, start in enumerate(starts):
        later = starts[number + 1] if number + 1 < len(starts) else None
        out.redone_steps += start.get("redone_steps") or 0
        seconds = start.get("seconds")
        if seconds is None:
            out.unaccounted_jobs += 1
            continue
        devices = start.get("world_size") or 1
        out.allocated += seconds * devices
        for phase, spent in _job_phases(seconds, start.get("split") or {},
                                        start.get("redone_seconds") or 0.0).items():
            out.phases[phase] += spent * devices
        if later is not None:
            began = start.get("claimed") or start.get("time")
            follows = later.get("claimed") or later.get("time")
            out.between_jobs += max(0.0, follows - began - seconds)
    return out


def _job_phases(seconds: float, split: dict, redone_seconds: float) -> dict:
    """One job's seconds by phase: its split, the training a later start did again (its
    `redone_seconds`, added to its seconds when that start was recorded), and the rest of
    its seconds as `other`."""
    training = split.get("training") or 0.0
    waited = min(split.get("data_wait") or 0.0, training)
    phases = {"productive": training - waited, "data_wait": waited,
              "evaluation": split.get("evaluation") or 0.0,
              "checkpoint": split.get("checkpoint") or 0.0,
              "startup": split.get("startup") or 0.0, "lost_work": redone_seconds}
    phases["other"] = max(0.0, seconds - sum(phases.values()))
    return phases
