"""The seam between hpctrain and a batch scheduler: what the rest of hpctrain may ask one.

A scheduler is a module of cluster/ that answers the questions of `Scheduler` (slurm.py does,
in the manner of submitit's Executor); nothing outside cluster/ names one or its commands. To
add one (PBS Pro, Flux): a module beside slurm.py with these names, and its line in
SCHEDULERS; a cluster profile names it (`scheduler:` in clusters.yaml), and the jobs hpctrain
submits and follows from a login node go to the profile's. Job states are hpctrain's own
(records.STATES): each scheduler translates its own into them in its answers (queue,
elements, accounting).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from hpctrain.cluster import slurm
from hpctrain.cluster.records import JobElement, ProcessEnv
from hpctrain.errors import ConfigError


class Scheduler(Protocol):
    """What hpctrain asks a scheduler (each a module-level name of its module)."""

    NAME: str
    TITLE: str  # its name in what hpctrain prints ("Slurm")
    SCRATCH_VARIABLE: str  # the job's node-local folder, where the site sets one
    LAUNCHER: tuple[str, ...]  # inside a job: the command that starts a step's tasks
    SCRIPT_OPTION: str  # the command-line option that adds one line to its batch script
    SCRIPT_EXAMPLE: str  # such a line, for the option's help
    STEP_EXAMPLE: str  # its launcher starting 8 tasks per node, for help texts
    SOURCES: dict[str, str]  # the command that answers `elements` and `accounting` (said)
    JOB_ID: re.Pattern  # a job id as it writes one (an array element's too)
    JOB_LOG: str  # its jobs' log in the run directory: {job} the id, {stream} out | err

    # inside a job
    def current_job(self, environ: Mapping[str, str]) -> str | None: ...
    def restarts(self, environ: Mapping[str, str]) -> int: ...
    def cluster_name(self, environ: Mapping[str, str]) -> str | None: ...
    def step(self, environ: Mapping[str, str], host: str) -> ProcessEnv | None: ...
    def job_end_time(self, job_id: str, environ: Mapping[str, str]) -> float | None: ...
    def requeue(self, job_id: str, script_continues: bool) -> str: ...

    # from a login node
    def script(self, request, profile) -> str: ...  # request.JobRequest, profiles.Profile
    def submit(self, path: Path) -> str: ...
    def queue(self, job_ids: list[str] | None = None, name: str | None = None,
              everyone: bool = False) -> list[dict]: ...
    def elements(self, job_id: str) -> list[JobElement]: ...
    def accounting(self, job_id: str) -> dict | None: ...
    def allocations(self, job_ids: list[str]) -> list[dict] | None: ...
    def cancel(self, job_id: str, signal: str | None = None) -> None: ...
    def largest_node_cpus(self, partition: str | None) -> int | None: ...


SCHEDULERS: dict[str, Scheduler] = {slurm.NAME: slurm}


DEFAULT = slurm.NAME  # a cluster profile's scheduler, where it names none


def current(environ: Mapping[str, str] | None = None) -> Scheduler:
    """The scheduler whose job this process runs in (its in-job questions); outside a job,
    the default one, whose in-job answers are all "none"."""
    env = os.environ if environ is None else environ
    return next((s for s in SCHEDULERS.values() if s.current_job(env)), SCHEDULERS[DEFAULT])


def named(name: str | None) -> Scheduler:
    """The scheduler a cluster profile names (`scheduler:`; None: DEFAULT), which hpctrain
    submits to and asks about jobs from a login node."""
    name = name or DEFAULT
    if name not in SCHEDULERS:
        raise ConfigError(f"cluster profile: unknown scheduler {name!r}; hpctrain speaks to "
                          f"{', '.join(sorted(SCHEDULERS))}")
    return SCHEDULERS[name]


def job_logs() -> tuple[str, ...]:
    """Every scheduler's job log name (`JOB_LOG`): a run directory's logs are any of them."""
    return tuple(dict.fromkeys(s.JOB_LOG for s in SCHEDULERS.values()))


def in_job(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a scheduler's job."""
    env = os.environ if environ is None else environ
    return any(s.current_job(env) for s in SCHEDULERS.values())
