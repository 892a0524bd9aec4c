"""Where a run's device-seconds went (`hpctrain goodput RUN`), from its run.json: every job
of the run (each start, also one that died without a word) with its seconds, its devices and
its seconds by phase (written at every checkpoint and when the job ends: bookkeeping.Clock),
each start's `redone_steps`, the steps the job before it trained after the checkpoint it
resumed from (counted from the records it forgot, not guessed), and that job's
`redone_seconds`, those steps at the median step time of those records, which its seconds
include.

The phases of a job's device-seconds (`PHASES`): productive training steps; the steps' wait
for data; evaluation; the part of checkpoint saves the training waited for (with
`async_save`, the copy to host memory) and, apart, the steps slowed while such a save wrote
behind them (bookkeeping.Clock.count_save_dip); start-up
(imports, the build, a resume's load, up to the training loop); a hang (the seconds without
progress before the hang watch ended the job: monitor/hangs.py); work lost to a stop (the
steps redone: a job killed without a word trained them after its last checkpoint, and the
start that does them again adds them to its seconds); the rest (shutdown, and the logging
interval under way at a job's last record). Goodput is productive over allocated. The wall
time between one job's end and the next one's start (queue, requeue) is told beside, not
counted as allocated: no device is held then.

With the scheduler's accounting (`allocations`: every run of the run's jobs, requeued ones
too), a job's allocated seconds are the scheduler's, start to end, times its GPUs (its
processes where it has none), and what the run's records do not cover is a
phase of its own, `unrecorded`: the job's script and launch before hpctrain started and
after it ended, GPUs allocated that the run started no process on, the end of a job killed
without a word after its last heartbeat, a run of the job that never reached hpctrain. A
job whose processes outlived the scheduler's end (a cancel's grace to save: Slurm stops the
clock at the cancel) counts the longer of the two; one the scheduler still counts as
running (its accounting hears of an end a little after the queue does) counts to now. The
gaps between jobs are then the scheduler's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

PHASES = ("productive", "data_wait", "evaluation", "checkpoint", "save_dip", "startup",
          "compilation", "hung", "lost_work", "other", "unrecorded")
DESCRIBED = {"productive": "training steps", "data_wait": "steps waiting for data",
             "evaluation": "evaluation", "checkpoint": "checkpoint saves (blocking)",
             "save_dip": "steps slowed by a save writing behind them (async_save)",
             "startup": "start-up (imports, build, resume's load)",
             "compilation": "compilation (torch.compile, in steps and evaluations)",
             "hung": "hung: no progress until the hang watch ended the job",
             "lost_work": "work lost to stops (steps redone)",
             "other": "shutdown, and the rest",
             "unrecorded": "in the job, outside the run's records (script, launch, GPUs "
                           "unused)"}
# a start-up's parts (run.json's split, bookkeeping.Clock's marks): from the process's start to
# the build, the build, a resume's load; the rest of the start-up is the run's records
STARTUP_PARTS = {"imports": "imports", "build": "build", "resume_load": "resume's load"}
SCHEDULER, RECORDS = "the scheduler's accounting", "the run's own records"
ROUNDING = 2.0  # seconds: accounting's whole seconds, against a start's time in fractions


@dataclass
class Account:
    """A run's device-seconds by phase, its jobs' and between them."""

    jobs: int = 0
    allocated: float = 0.0  # device-seconds of every job
    phases: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    gaps: list = field(default_factory=list)  # wall seconds from each job's end to the next
    unaccounted_jobs: int = 0  # jobs that left no seconds (run.json of an older hpctrain)
    redone_steps: int = 0
    source: str = RECORDS  # where the jobs' allocated seconds come from
    recorded: float = 0.0  # device-seconds of the run's own records, for the comparison
    scheduler: float | None = None  # device-seconds the scheduler reports for the jobs
    startups: list = field(default_factory=list)  # each recorded job's start, by part

    @property
    def between_jobs(self) -> float:
        return sum(self.gaps)

    @property
    def goodput(self) -> float | None:
        return self.phases["productive"] / self.allocated if self.allocated else None

    def as_dict(self) -> dict:
        return {"jobs": self.jobs, "allocated_device_seconds": self.allocated,
                "device_seconds": dict(self.phases),
                "shares": {phase: seconds / self.allocated if self.allocated else None
                           for phase, seconds in self.phases.items()},
                "goodput": self.goodput, "between_jobs_seconds": self.between_jobs,
                "gaps_seconds": list(self.gaps),
                "redone_steps": self.redone_steps, "jobs_without_seconds":
                self.unaccounted_jobs, "source": self.source,
                "recorded_device_seconds": self.recorded,
                "scheduler_device_seconds": self.scheduler, "startups": list(self.startups)}


@dataclass
class _Job:
    """One job as the run recorded it (`start`, run.json's) and as the scheduler did
    (`held`: one of `allocations`); either may be missing."""

    start: dict | None
    held: dict | None

    @property
    def began(self) -> float:
        """When it began (epoch seconds): the scheduler's start, else the run's."""
        return self.held["start"] if self.held is not None else _began(self.start)

    def span(self, now: float) -> tuple[float, float] | None:
        """(began, ended) in epoch seconds: the scheduler's, else the run's."""
        if self.held is not None:
            return self.began, self.held["end"] or now
        seconds = self.start.get("seconds")
        return None if seconds is None else (self.began, self.began + seconds)


def account(record: dict, allocations: list[dict] | None = None,
            now: float | None = None) -> Account:
    """The account of run.json's `record` (read through runs.identity.read_identity), with the
    scheduler's `allocations` of its jobs where there are any (cluster.jobs.allocations)."""
    starts = [start for start in record.get("starts", []) if isinstance(start, dict)]
    jobs = _matched(starts, allocations or [])
    now = time.time() if now is None else now
    out = Account(jobs=len(jobs))
    if allocations:
        out.source, out.scheduler = SCHEDULER, 0.0
    for job in jobs:
        _count(out, job, now)
    spans = [span for span in (job.span(now) for job in jobs) if span is not None]
    out.gaps = [max(0.0, began - ended) for (_, ended), (began, _) in zip(spans, spans[1:])]
    return out


def _matched(starts: list[dict], allocations: list[dict]) -> list[_Job]:
    """Each start beside the scheduler's run of its job that it began in (the last one of its
    job id started before it), in the order they began; a run of the scheduler's that no
    start began in stands alone (it never reached hpctrain)."""
    free = list(allocations)
    jobs = []
    for start in starts:
        began = _began(start)
        mine = [a for a in free if a["id"] == start.get("job_id") and
                a["start"] <= began + ROUNDING]
        held = mine[-1] if mine else None
        if held is not None:
            free.remove(held)
        jobs.append(_Job(start, held))
    jobs += [_Job(None, held) for held in free]
    return sorted(jobs, key=lambda job: job.began)


def _began(start: dict) -> float:
    """When a start began: its process's start, else when it claimed the run (its lock),
    else when it was recorded."""
    for key in ("began", "claimed", "time"):
        if start.get(key) is not None:
            return start[key]
    return 0.0


def _count(out: Account, job: _Job, now: float) -> None:
    """One job into the account: its phases from its split, for the devices it used; its
    allocated seconds the scheduler's where known, for the devices it was given, and the
    difference `unrecorded`."""
    start = job.start or {}
    out.redone_steps += start.get("redone_steps") or 0
    seconds = start.get("seconds")
    if seconds is None and job.held is None:
        out.unaccounted_jobs += 1
        return
    used = start.get("world_size") or 1
    own = (seconds or 0.0) * used
    out.recorded += own
    total = own
    if job.held is not None:
        given = job.held.get("devices") or used
        scheduled = (job.held["end"] or now) - job.held["start"]
        out.scheduler += scheduled * given
        total = max(scheduled * given, own)
        out.phases["unrecorded"] += total - own
    out.allocated += total
    if job.start is not None and (startup := _startup(start)) is not None:
        out.startups.append(startup)
    if seconds is not None:
        for phase, spent in _job_phases(seconds, start.get("split") or {},
                                        start.get("redone_seconds") or 0.0,
                                        bool(start.get("hung"))).items():
            out.phases[phase] += spent * used


def _startup(start: dict) -> dict | None:
    """A job's way to its first step, in seconds: the start-up's parts (STARTUP_PARTS, the
    rest of it as `rest`), its compiling, and when its first step ended; None where its
    record has no parts (an older hpctrain's, or a job that ended before training)."""
    split = start.get("split") or {}
    if split.get("startup") is None or "imports" not in split:
        return None
    parts = {name: split.get(name) for name in STARTUP_PARTS}
    rest = split["startup"] - sum(value or 0.0 for value in parts.values())
    return {"job_id": start.get("job_id"), **parts, "rest": max(0.0, rest),
            "compilation": split.get("compilation"), "first_step": split.get("first_step")}


def _job_phases(seconds: float, split: dict, redone_seconds: float, hung: bool) -> dict:
    """One job's seconds by phase: its split, the training a later start did again (its
    `redone_seconds`: after its split's last record, or in a hung job's split, whose
    training it is then taken from), and the rest of its seconds as `other`. The redone
    seconds are an estimate (steps at a median step time): they take at most the seconds
    the job has beyond its split (its training when it hung, each part of it its share), so
    the phases add up to its seconds and never past them."""
    training = split.get("training") or 0.0
    waited = min(split.get("data_wait") or 0.0, training)
    dip = min(split.get("save_dip") or 0.0, training - waited)
    productive = training - waited - dip
    evaluation = split.get("evaluation") or 0.0
    compiled = split.get("compilation") or 0.0  # within the training's and evaluations'
    in_evaluation = min(split.get("compilation_in_evaluation") or 0.0, compiled, evaluation)
    in_training = min(compiled - in_evaluation, productive)
    phases = {"productive": productive - in_training, "data_wait": waited,
              "evaluation": evaluation - in_evaluation,
              "checkpoint": split.get("checkpoint") or 0.0, "save_dip": dip,
              "startup": split.get("startup") or 0.0,
              "compilation": in_training + in_evaluation, "hung": split.get("hung") or 0.0}
    if hung and training:  # the redone steps were in its training: each part its share
        lost = min(redone_seconds, training)
        for part in ("productive", "data_wait", "save_dip"):
            phases[part] *= 1 - lost / training
    else:
        lost = min(redone_seconds, max(0.0, seconds - sum(phases.values())))
    phases["lost_work"] = lost
    phases["other"] = max(0.0, seconds - sum(phases.values()))
    return phases
