"""The Slurm client commands, plain text in and parsed text out: sbatch, squeue, scontrol,
sacct, scancel. A missing command or a refusal becomes a ClusterError with Slurm's own words.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hpctrain.errors import UserError


class ClusterError(UserError):
    """Slurm is not there, or refused the request (its message is kept)."""


QUEUE_FIELDS = ("id", "name", "state", "elapsed", "time_left", "nodes", "reason")
QUEUE_FORMAT = "%i|%j|%T|%M|%L|%D|%R"


def run(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(args[0]) is None:
        raise ClusterError(f"'{args[0]}' is not on PATH: is this a Slurm login node? (On a "
                           "cluster, load its Slurm module; elsewhere use hpctrain run.)")
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise ClusterError(f"{' '.join(args[:2])} failed: {message}")
    return done


def submit(script: Path) -> str:
    """Submit `script`; the job id."""
    out = run(["sbatch", "--parsable", str(script)]).stdout.strip()
    return out.split(";")[0]


def queue(job_ids: list[str] | None = None, name: str | None = None,
          everyone: bool = False) -> list[dict]:
    """Jobs in the queue (yours unless `everyone`), as dicts of QUEUE_FIELDS."""
    args = ["squeue", "-h", "-o", QUEUE_FORMAT]
    if job_ids:
        args += ["-j", ",".join(job_ids)]
    elif not everyone:
        args.append("--me")
    if name:
        args += ["-n", name]
    done = run(args, check=False)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return []  # finished and forgotten by the controller
        raise ClusterError(f"squeue failed: {done.stderr.strip()}")
    return [dict(zip(QUEUE_FIELDS, line.split("|", len(QUEUE_FIELDS) - 1)))
            for line in done.stdout.splitlines() if line.strip()]


def job_details(job_id: str) -> list[dict]:
    """`scontrol show job` as one dict per job (an array job: per element) with JobState,
    StdOut, Restarts, ...; empty when the controller no longer knows the job."""
    done = run(["scontrol", "show", "job", "-o", job_id], check=False)
    if done.returncode != 0:
        return []
    jobs = []
    for line in done.stdout.splitlines():
        details = {}
        for item in line.split():
            key, sep, value = item.partition("=")
            if sep:
                details[key] = value
        if details:
            jobs.append(details)
    return jobs


def largest_node_cpus(partition: str | None) -> int | None:
    """The most CPUs one node of `partition` (None: the default partition) has, from sinfo;
    None where sinfo is missing or cannot say."""
    if shutil.which("sinfo") is None:
        return None
    done = run(["sinfo", "-h", "-N", "-o", "%P %c", *(["-p", partition] if partition else [])],
               check=False)
    cpus = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        name, _, count = line.partition(" ")
        if (partition or name.endswith("*")) and count.strip().rstrip("+").isdigit():
            cpus.append(int(count.strip().rstrip("+")))
    return max(cpus, default=None)


def accounting(job_id: str) -> dict | None:
    """The job's final record from sacct, or None without accounting."""
    if shutil.which("sacct") is None:
        return None
    done = run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,JobName,State,ExitCode,"
                "Elapsed,Start,End"], check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return None  # "Slurm accounting storage is disabled", or not recorded yet
    fields = ("id", "name", "state", "exit_code", "elapsed", "start", "end")
    return dict(zip(fields, done.stdout.splitlines()[-1].split("|")))


def cancel(job_id: str, signal: str | None = None) -> None:
    run(["scancel", *([f"--signal={signal}"] if signal else []), job_id])
