"""The seam between hpctrain and a batch scheduler: what the rest of hpctrain may ask one.

A scheduler is a module of cluster/ that answers the questions of `Scheduler` (slurm.py does,
in the manner of submitit's Executor); nothing outside cluster/ names one. To add one (PBS
Pro, Flux): a module beside slurm.py with these names, and its line in SCHEDULERS. Job states
are spoken in Slurm's words (PENDING, RUNNING, COMPLETED, ...; jobs.FINAL_STATES): another
scheduler translates its own into them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from hpctrain.cluster import slurm
from hpctrain.cluster.records import JobElement, ProcessEnv


class Scheduler(Protocol):
    """What hpctrain asks a scheduler (each a module-level name of its module)."""

    NAME: str
    SCRATCH_VARIABLE: str  # the job's node-local folder, where the site sets one

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
    def cancel(self, job_id: str, signal: str | None = None) -> None: ...
    def largest_node_cpus(self, partition: str | None) -> int | None: ...


SCHEDULERS: dict[str, Scheduler] = {slurm.NAME: slurm}


def current(environ: Mapping[str, str] | None = None) -> Scheduler:
    """The scheduler whose job this process runs in; outside a job, the one hpctrain submits
    to (Slurm, the only one today)."""
    env = os.environ if environ is None else environ
    return next((s for s in SCHEDULERS.values() if s.current_job(env)), SCHEDULERS["slurm"])


def in_job(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a scheduler's job."""
    env = os.environ if environ is None else environ
    return any(s.current_job(env) for s in SCHEDULERS.values())
