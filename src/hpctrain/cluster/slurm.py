"""Slurm, behind the scheduler seam (scheduler.py says what a scheduler answers).

Inside a job: which tasks srun started (the step's ranks, nodes and rendezvous, read from its
variables: the node list is expanded here, no `scontrol show hostnames` needed, so it also
works inside containers; the port comes from the job id, so every task computes the same
address on its own), when the job ends, and the requeue. From a login node: the batch script
(sbatch.py) and the client commands, plain text in and parsed text out: sbatch, squeue,
scontrol, sacct, scancel, sinfo. A missing command or a refusal becomes a ClusterError with
Slurm's own words; the in-job questions answer None instead, and the caller falls back (no
deadline; the requeue left to the batch script through the exit status).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path

from hpctrain.cluster.records import (MOST_RESTARTS, UNKNOWN, ClusterError, JobElement,
                                      ProcessEnv, below, whole_number)
from hpctrain.cluster import sbatch
from hpctrain.cluster.sbatch import render
from hpctrain.commands import OutputTooLarge, run_command
from hpctrain.errors import ConfigError

NAME = "slurm"
TITLE = "Slurm"
SCRATCH_VARIABLE = "SLURM_TMPDIR"  # the job's node-local folder, where the site sets one
LAUNCHER = ("srun",)
SCRIPT_OPTION = "--extra-sbatch"
SCRIPT_EXAMPLE = "--mail-type=END"
STEP_EXAMPLE = "srun --ntasks-per-node 8"
SOURCES = {"elements": "scontrol", "accounting": "sacct"}
JOB_ID = re.compile(r"\d+(_\d+)?")  # 123456, or an array element's 123456_7
JOB_LOG = sbatch.JOB_LOG  # as its batch script names it

# Slurm's job states in hpctrain's words (scheduler.STATES): those it shares are its own;
# the passing ones fold into waiting or working; any other is UNKNOWN
_SHARED = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
           "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REQUEUED")
STATES = {**{state: state for state in _SHARED},
          "CONFIGURING": "PENDING", "RESV_DEL_HOLD": "PENDING", "REQUEUE_FED": "REQUEUED",
          "REQUEUE_HOLD": "REQUEUED", "SPECIAL_EXIT": "REQUEUED", "STOPPED": "SUSPENDED",
          "COMPLETING": "RUNNING", "RESIZING": "RUNNING", "SIGNALING": "RUNNING",
          "STAGE_OUT": "RUNNING", "REVOKED": "CANCELLED", "LAUNCH_FAILED": "FAILED"}


def state(words: str) -> str:
    """A state as Slurm says it ("CANCELLED by 1234", "RUNNING") in hpctrain's words, with
    what Slurm adds after it kept ("CANCELLED by 1234")."""
    first, _, rest = words.strip().partition(" ")
    return " ".join(part for part in (STATES.get(first, UNKNOWN), rest) if part)


# ---- inside a job ---------------------------------------------------------------------------

def current_job(environ: Mapping[str, str]) -> str | None:
    """The job this process runs in, or None outside one."""
    return environ.get("SLURM_JOB_ID") or None


def restarts(environ: Mapping[str, str]) -> int:
    """How often Slurm itself requeued this job."""
    return whole_number(environ, "SLURM_RESTART_COUNT", default=0, high=MOST_RESTARTS)


def cluster_name(environ: Mapping[str, str]) -> str | None:
    return environ.get("SLURM_CLUSTER_NAME") or None


def step(environ: Mapping[str, str], host: str) -> ProcessEnv | None:
    """The tasks of an srun step, or None where this process was not started by one."""
    if "SLURM_STEP_NUM_TASKS" not in environ or "SLURM_PROCID" not in environ:
        return None
    return _slurm_step(environ, host, current_job(environ))


def _slurm_step(env: Mapping[str, str], host: str, job_id: str | None) -> ProcessEnv:
    world = whole_number(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", low=1)
    layout_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") \
        or str(world)
    layout = tasks_per_node(layout_text)
    if len(set(layout)) > 1:
        raise ConfigError(
            f"Slurm placed an unequal number of tasks on the nodes ({layout_text}: "
            f"{', '.join(map(str, layout))}); data-parallel training needs the same number on "
            "each node. Ask for --ntasks-per-node=K (with --nodes=N) instead of --ntasks.")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or host
    master = env.get("MASTER_ADDR") or next(hosts_of(nodelist), host)
    port = whole_number(env, "MASTER_PORT", default=port_for_job(job_id or "0"), low=1,
                        high=65535)
    found = ProcessEnv(
        launcher="slurm", rank=whole_number(env, "SLURM_PROCID"), world_size=world,
        local_rank=whole_number(env, "SLURM_LOCALID", default=0), local_world_size=layout[0],
        node_rank=whole_number(env, "SLURM_NODEID", default=0), num_nodes=len(layout),
        master_addr=master, master_port=port, hostname=host, job_id=job_id)
    tasks = "SLURM_STEP_NUM_TASKS" if env.get("SLURM_STEP_NUM_TASKS", "").strip() else \
        "SLURM_NTASKS"
    below(found.rank, "SLURM_PROCID", world, tasks)
    below(found.local_rank, "SLURM_LOCALID", layout[0], "the tasks per node")
    below(found.node_rank, "SLURM_NODEID", len(layout), "the nodes")
    if sum(layout) != world:
        raise ConfigError(f"{tasks}={world} but the tasks per node ({layout_text}) add up to "
                          f"{sum(layout)}; the launcher sets both, so unset or fix what "
                          "changed them")
    return found


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list, e.g. 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07 login1.
    Ranges keep their zero padding; several bracket groups in one name multiply out."""
    return list(hosts_of(text))


def hosts_of(text: str) -> Iterator[str]:
    """expand_hostlist one host at a time: the first of 'n[0-999999999]' without the rest."""
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        yield from _expand_one(item)


def _expand_one(name: str) -> Iterator[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if match is None:
        yield name
        return
    head, tail = name[:match.start()], name[match.end():]
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or not (high.isdigit() or not high):
            raise ConfigError(f"cannot read the Slurm host list {name!r} ({part!r} is not a "
                              "number or a range of numbers)")
        for number in range(int(low), int(high or low) + 1):
            yield from _expand_one(f"{head}{number:0{len(low)}d}{tail}")


MAX_NODES = 1_000_000  # beyond any machine: a layout that says more is damaged


def tasks_per_node(text: str) -> list[int]:
    """Slurm's task layout, e.g. '4(x2),3' -> [4, 4, 3]."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None or len(counts) + int(match.group(2) or 1) > MAX_NODES:
            raise ConfigError(f"cannot read the Slurm task layout {text!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def port_for_job(job_id: str) -> int:
    """A port every task of the job derives alike; spread so that jobs sharing a node rarely
    collide."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return 20000 + int(digits) % 40000


def job_end_time(job_id: str, environ: Mapping[str, str]) -> float | None:
    """The job's scheduled end as Unix time: SLURM_JOB_END_TIME (Slurm >= 23.02), else
    `squeue -o %e`; None without a time limit or without a way to ask."""
    text = environ.get("SLURM_JOB_END_TIME", "").strip()
    if text.isdigit() and int(text) > 0:
        return float(text)
    if shutil.which("squeue") is None:
        return None
    try:
        out = run_command(["squeue", "-h", "-j", job_id, "-o", "%e"], 30).stdout.strip()
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
    try:
        done = run_command(["scontrol", "requeue", job_id], 60)
    except (subprocess.SubprocessError, OSError) as err:
        return (f"'scontrol requeue {job_id}' failed ({err}): exiting with the requeue "
                "status for the batch script to act on.")
    if done.returncode == 0:
        return f"Requeued Slurm job {job_id}."
    return (f"'scontrol requeue {job_id}' failed ({done.stderr.strip() or done.returncode}): "
            "exiting with the requeue status for the batch script to act on.")


# ---- from a login node ----------------------------------------------------------------------

script = render  # the batch script of a request (sbatch.py)

QUEUE_FIELDS = ("id", "name", "state", "elapsed", "time_left", "nodes", "reason")
QUEUE_FORMAT = "%i|%j|%T|%M|%L|%D|%R"


def run(args: list[str], check: bool = True,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    if shutil.which(args[0]) is None:
        raise ClusterError(f"'{args[0]}' is not on PATH: is this a Slurm login node? (On a "
                           "cluster, load its Slurm module; elsewhere use hpctrain run.)")
    try:
        done = run_command(args, 120, env=None if env is None else {**os.environ, **env})
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{' '.join(args[:2])} did not answer within 120 s: is the "
                           "scheduler's controller reachable from here?") from None
    except OutputTooLarge as err:
        raise ClusterError(f"{err}: more than a scheduler's answer; is '{args[0]}' on PATH "
                           "the scheduler's own?") from None
    except OSError as err:
        raise ClusterError(f"{args[0]} could not be started: {err}") from None
    if check and done.returncode != 0:
        message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise ClusterError(f"{' '.join(args[:2])} failed: {message}")
    return done


def submit(path: Path) -> str:
    """Submit the batch script at `path`; the job id."""
    out = run(["sbatch", "--parsable", str(path)]).stdout.strip()
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
    jobs = [dict(zip(QUEUE_FIELDS, line.split("|", len(QUEUE_FIELDS) - 1)))
            for line in done.stdout.splitlines() if line.strip()]
    return [{**job, "state": state(job.get("state", UNKNOWN))} for job in jobs]


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


def elements(job_id: str) -> list[JobElement]:
    """The job (an array job: each element) as the scheduler seam describes it."""
    found = job_details(job_id)
    array = len(found) > 1 or any("ArrayTaskId" in d for d in found)
    return [JobElement(state=state(d.get("JobState", UNKNOWN)), reason=d.get("Reason"),
                       restarts=int(d.get("Restarts", 0)),
                       element=d.get("ArrayTaskId", d.get("JobId")) if array else None,
                       stdout=d.get("StdOut"), stderr=d.get("StdErr"))
            for d in found]


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
    record = dict(zip(fields, done.stdout.splitlines()[-1].split("|")))
    return {**record, "state": state(record.get("state", UNKNOWN))}


def allocations(job_ids: list[str]) -> list[dict] | None:
    """Every run of each job as accounting has it, a requeued job's every run too (-D: each
    requeue runs again under the same id), in the order they started: {id, start, end,
    devices, state}, start and end in epoch seconds (end None while it runs), devices the
    GPUs allocated (None where the job has none: a CPU job). None without accounting. Runs
    that never started (pending) are left out."""
    if not job_ids or shutil.which("sacct") is None:
        return None
    done = run(["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(job_ids), "-o",
                "JobID,State,Start,End,AllocTRES"], check=False,
               env={"SLURM_TIME_FORMAT": "%s"})  # epoch seconds, whatever the locale
    if done.returncode != 0:
        return None  # "Slurm accounting storage is disabled"
    found = []
    for line in done.stdout.splitlines():
        job_id, words, start, end, tres = (line.split("|") + [""] * 5)[:5]
        if not start.isdigit():
            continue
        gpus = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", tres)
        found.append({"id": job_id, "state": state(words), "start": float(start),
                      "end": float(end) if end.isdigit() else None,
                      "devices": int(gpus.group(1)) if gpus else None})
    return sorted(found, key=lambda a: a["start"])


def cancel(job_id: str, signal: str | None = None) -> None:
    run(["scancel", *([f"--signal={signal}"] if signal else []), job_id])
