"""What a running Slurm job can ask about itself: when it ends, and to be requeued.

Both go through the Slurm client commands, which may be missing (a container without them):
then the answer is None and the caller falls back (no deadline; leave the requeue to the
batch script through the exit status).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from datetime import datetime


def job_end_time(job_id: str, environ: Mapping[str, str]) -> float | None:
    """The job's scheduled end as Unix time: SLURM_JOB_END_TIME (Slurm >= 23.02), else
    `squeue -o %e`; None without a time limit or without a way to ask."""
    text = environ.get("SLURM_JOB_END_TIME", "").strip()
    if text.isdigit() and int(text) > 0:
        return float(text)
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%e"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        return datetime.fromisoformat(out).timestamp()  # local time, like squeue prints it
    except (subprocess.SubprocessError, OSError, ValueError):
        return None  # no limit ("N/A"), job unknown, or slurmctld unreachable


def requeue(job_id: str, script_continues: bool) -> str:
    """Have the job continued; returns what happens, for the log. A script written by
    `hpctrain submit` continues it in a new job itself (HPCTRAIN_CONTINUES=script). Any other
    job is requeued with scontrol: Slurm then holds it until its credential expires (AuthInfo
    cred_expire, 2 minutes by default) before it may start again."""
    if script_continues:
        return "The batch script continues it in a new job."
    if shutil.which("scontrol") is None:
        return ("scontrol is not available here: exiting with the requeue status for the "
                "batch script to act on.")
    done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True,
                          timeout=60)
    if done.returncode == 0:
        return f"Requeued Slurm job {job_id}."
    return (f"'scontrol requeue {job_id}' failed ({done.stderr.strip() or done.returncode}): "
            "exiting with the requeue status for the batch script to act on.")
