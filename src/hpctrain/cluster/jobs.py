"""Submit a recipe as a job of the cluster's scheduler and follow it: the Python API behind
`hpctrain submit`, `jobs`, `logs`, `cancel` and `status`, usable from a notebook:

    from hpctrain.cluster.jobs import submit, queue
    job = submit("default", ["train.epochs=3"], gpus=8, time="2:00:00")
    job.wait(); print(job.state, job.logs()[-500:])

Every submitted job is remembered in the job ledger (runs/directory.py: job id -> run
directory), so a job the controller has forgotten, on a cluster without accounting, is still
reported from its run directory rather than as an unexplained UNKNOWN.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpctrain.commands import OutputTooLarge, run_command
from hpctrain.cluster import scheduler
from hpctrain.cluster.profiles import Profile, get_profile
from hpctrain.cluster.records import FINAL_STATES, UNKNOWN, ClusterError
from hpctrain.cluster.request import JobRequest, layout
from hpctrain.config import code_references, load_config, plain_name
from hpctrain.errors import ConfigError
from hpctrain.readers import MiB, chunks, tail_text
from hpctrain.runs.directory import (SUMMARY, RunDir, is_checkpoint, new_run_name, read_ledger,
                                     remember_job)
from hpctrain.runs.identity import read_identity
from hpctrain.runs.lock import Holder
from hpctrain.runs.scan import LOST_AFTER_SECONDS, scan_run
from hpctrain.writers import write_whole

LOG_TEXT_CAP = 16 * MiB  # of each job's log, read back as text (the end: where a job fails)


def scheduler_of(profile: Profile | None = None) -> scheduler.Scheduler:
    """The scheduler jobs are submitted to and asked about from a login node: the cluster
    profile's (`profile`, else the one in use: $HPCTRAIN_CLUSTER or generic)."""
    return scheduler.named((profile or get_profile(None)).scheduler)


def _recall(job_id: str) -> Path | None:
    found = [row["run_dir"] for row in read_ledger() if row.get("job_id") == job_id]
    return Path(found[-1]) if found else None


def _continuations() -> dict[str, str]:
    """Stopped job -> the job it continues in, as the batch scripts recorded them (an array
    element is keyed `ID_TASK`)."""
    return {row["continues"]: row["job_id"] for row in read_ledger() if "continues" in row}


def _follow(job_id: str, continuations: dict[str, str], task: str | None = None) -> list[str]:
    """The job and those it continued in, oldest first."""
    ids = [job_id]
    while (later := continuations.get(f"{ids[-1]}_{task}" if task else ids[-1])) is not None \
            and later not in ids:
        ids.append(later)
    return ids


def _overall(states: list[str]) -> str:
    """One state for several (array elements): the first unfinished, else the first that did
    not complete, else COMPLETED."""
    unfinished = [s for s in states if s not in FINAL_STATES]
    failed = [s for s in states if s != "COMPLETED"]
    return unfinished[0] if unfinished else failed[0] if failed else "COMPLETED"


@dataclass
class Job:
    id: str
    run_dir: Path | None = None

    def __post_init__(self):
        self.id = str(self.id).split("_")[0]
        if self.run_dir is None:
            self.run_dir = _recall(self.id)

    def status(self) -> dict:
        """Where the job stands, and where that was read (squeue/scontrol, sacct, or the run
        directory when Slurm has forgotten the job and keeps no accounting). A job that stopped
        early and continues in a new job reports the state of its continuation, with the ids
        in `chain`."""
        continuations = _continuations()
        for _ in range(3):  # a job that continued while the scheduler was asked: ask again
            status = self._status_after(continuations)
            continuations, asked = _continuations(), continuations
            if continuations == asked:
                break
        return status

    def _status_after(self, continuations: dict[str, str]) -> dict:
        """status() for these continuations: a batch script records its continuation before
        its job ends, so the record of a job seen ended is among them if read after."""
        ids = _follow(self.id, continuations)
        job = scheduler_of()  # once: each call reads the cluster profiles
        status = self._own_status(ids[-1], job)
        if len(ids) > 1:
            status["chain"] = ids
            if status.get("source") == job.SOURCES["elements"]:
                # as the run counts them (its summary does it itself): each continuation, and
                # each requeue by the scheduler
                earlier = [e.restarts for job_id in ids[:-1] for e in job.elements(job_id)]
                status["restarts"] += len(ids) - 1 + sum(earlier)
        if "elements" not in status and self.run_dir is not None:  # also earlier submissions'
            status["restarts"] = max(status.get("restarts") or 0, self._run_restarts())
        if "elements" in status:
            for task in status["elements"]:
                later = _follow(ids[-1], continuations, task)
                if len(later) > 1:
                    status["elements"][task] = self._own_status(later[-1], job)["state"]
            status["state"] = _overall(list(status["elements"].values()))
        return status

    def _run_restarts(self) -> int:
        """How often the job's run was started again: its starts in run.json, which count the
        jobs of earlier submissions (submit resume=DIR) and those Slurm requeued, less one."""
        identity, _ = read_identity(self.run_dir)  # damaged: no restarts known
        return len(identity["starts"]) - 1 if identity and identity["starts"] else 0

    def _own_status(self, job_id: str, job: scheduler.Scheduler) -> dict:
        """Where `job_id` (this job, or one it continued in; an array element's id stands for
        its array) stands, as `job` says it."""
        job_id = str(job_id).split("_")[0]
        elements = job.elements(job_id)
        if elements:
            status = {"id": job_id, "state": _overall([e.state for e in elements]),
                      "reason": elements[0].reason,
                      "restarts": max(e.restarts for e in elements),
                      "run_dir": str(self.run_dir) if self.run_dir else None,
                      "source": job.SOURCES["elements"]}
            if elements[0].element is not None:
                status["elements"] = {e.element: e.state for e in elements}
            return status
        record = job.accounting(job_id)
        if record is not None:
            return {**record, "id": job_id, "source": job.SOURCES["accounting"],
                    "run_dir": str(self.run_dir) if self.run_dir else None}
        run = RunDir(self.run_dir).read_summary() if self.run_dir else None
        if run is not None:
            state = {"completed": "COMPLETED", "preempted": "REQUEUED-OR-STOPPED",
                     "hung": "REQUEUED-OR-STOPPED", "interrupted": "CANCELLED"}.get(
                         run.get("status"), "FAILED")
            return {"id": job_id, "state": state, "run_status": run.get("status"),
                    "steps": run.get("steps"), "restarts": run.get("restarts"),
                    "run_dir": str(self.run_dir), "source": SUMMARY}
        where = f"; its run directory {self.run_dir} has no summary.json" if self.run_dir \
            else "; it was not submitted by hpctrain from this account"
        return {"id": job_id, "state": UNKNOWN, "source": None,
                "reason": f"{job.NAME.capitalize()} no longer knows the job and keeps no "
                          "accounting" + where}

    @property
    def state(self) -> str:
        return self.status()["state"]

    def wait(self, timeout: float | None = None, poll: float = 5.0) -> str:
        """Block until the job reaches a final state (a requeued job is not final)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.state
            if state.split()[0] in FINAL_STATES or state == UNKNOWN:
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {state} after {timeout} s")
            time.sleep(poll)

    def chain(self) -> list[str]:
        """This job and the jobs it continued in, oldest first."""
        return _follow(self.id, _continuations())

    def log_file(self, err: bool = False) -> Path | None:
        """The log of the latest job of the chain (the one to follow)."""
        return self._own_log_file(self.chain()[-1], err, scheduler_of())

    def _own_log_file(self, job_id: str, err: bool, job: scheduler.Scheduler) -> Path | None:
        elements = job.elements(job_id)
        named = (elements[0].stderr if err else elements[0].stdout) if elements else None
        if named and "%" not in named:
            return Path(named)
        if self.run_dir is not None:
            return RunDir(self.run_dir).job_log(job.JOB_LOG, job_id, err)
        return None

    def log_files(self, err: bool = False) -> list[Path]:
        """The logs of every job of the chain, in order; ConfigError before the first."""
        job = scheduler_of()
        paths = [self._own_log_file(job_id, err, job) for job_id in self.chain()]
        found = [p for p in paths if p is not None and (p.is_file() or p.is_symlink())]
        if not found:
            raise ConfigError(f"no {'error' if err else 'output'} log for job {self.id} yet"
                              + (f" (expected {paths[0]})" if paths[0] else ""))
        return found

    def logs(self, err: bool = False, most_bytes: int = LOG_TEXT_CAP) -> str:
        """The logs' text, the last `most_bytes` of each at most (a log that is a link or no
        regular file reads as empty): `hpctrain logs` prints them whole, a chunk at a time."""
        return "".join(tail_text(p, most_bytes) for p in self.log_files(err))

    def cancel(self) -> None:
        scheduler_of().cancel(self.id)


def run_status(run_dir: Path) -> dict:
    """Where a run directory stands, read from its files (as `hpctrain runs` reads it: a
    running run whose heartbeat has stopped is lost), with the living process that holds it
    and, when it ran in scheduler jobs, where its last job stands."""
    row, _ = scan_run(run_dir)
    status = row["status"]
    if status == "running" and (row["heartbeat"] or 0) < time.time() - LOST_AFTER_SECONDS:
        status = "lost"
    identity, _ = read_identity(run_dir)
    starts = identity["starts"] if identity else []
    jobs = json.loads(row["jobs"])
    holder = Holder.read(RunDir(run_dir).lock) if status in ("running", "lost") else None
    found = {"run_dir": str(run_dir), "state": status, "problem": row["problem"],
             "steps": row["steps"], "restarts": max(0, len(starts) - 1),
             row["best_metric"] or "best": row["best_value"],
             "held_by": holder.describe() if holder else None, "jobs": jobs or None,
             "source": "run directory"}
    if jobs:
        try:
            found["job_state"] = Job(jobs[-1], run_dir).state
        except ClusterError as err:  # no scheduler here: the run's files say the rest
            found["job_state"] = f"unknown ({err})"
    return found


def sweep_elements(specs: list[str]) -> list[list[str]]:
    """`key=v1,v2` specs -> the cartesian product, one override list per array element."""
    axes = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key or not values:
            raise ConfigError(f"--sweep {spec!r}: write key=value1,value2,...")
        axes.append([f"{key}={value}" for value in values.split(",")])
    return [list(combination) for combination in itertools.product(*axes)]


def plan(recipe: str | None, overrides: list[str], gpus: int, time_limit: str,
         cluster: str | None = None, sweep: list[str] = (), **options) -> tuple[JobRequest, str]:
    """(request, script) without submitting: the recipe and overrides (every sweep element's)
    are validated here, so a typo fails now rather than after the queue."""
    config = load_config(recipe, overrides)
    elements = sweep_elements(list(sweep)) if sweep else []
    for element in elements:
        load_config(recipe, [*overrides, *element])
    name = options.pop("job_name", None)
    check_places(name, options)
    if options.get("autotune") is not None and elements:
        raise ConfigError("--autotune with --sweep: tune once (hpctrain autotune, or a job "
                          "with --autotune), then sweep over its tuned.yaml")
    run_name = config.run_name or name or new_run_name(config.name)
    run_dir = (Path(config.output_dir).expanduser() / run_name).absolute()
    resume_from = None
    if config.resume not in (None, "auto"):
        run_dir, resume_from = _resumed_place(config.resume, bool(elements))
    references = code_references(config)
    if references:
        check_user_code(references, options.get("venv"))
    profile = get_profile(cluster)
    check_model_layout(config, gpus, options.get("nodes"), profile)
    request = JobRequest(gpus=gpus, time=time_limit, run_dir=run_dir, recipe=recipe,
                         overrides=[o for o in overrides
                                    if not o.startswith(("run_name=", "resume="))],
                         job_name=name, sweep=elements, resume_from=resume_from,
                         workdir=Path.cwd(), user_code=bool(references), **options)
    return request, scheduler_of(profile).script(request, profile)


def check_model_layout(config, gpus: int, nodes: int | None, profile: Profile) -> None:
    """A job whose GPUs cannot hold the recipe's tensor x pipeline layout is refused before
    it queues: whole model copies, and each tensor-parallel group on one node."""
    p = config.parallel
    per_copy = p.tensor * p.pipeline
    if gpus % per_copy:
        low, high = max(per_copy, gpus // per_copy * per_copy), (gpus // per_copy + 1) * per_copy
        raise ConfigError(
            f"--gpus {gpus}: parallel.tensor={p.tensor} x parallel.pipeline={p.pipeline} is "
            f"{per_copy} GPUs per model copy; use --gpus {low} or {high}")
    per_node = layout(gpus, nodes, profile)[1]
    if per_node % p.tensor:
        raise ConfigError(
            f"parallel.tensor={p.tensor}: a tensor-parallel group must sit on one node, but "
            f"this job puts {per_node} GPU(s) on each node of {profile.name}; use --gpus that "
            f"fill nodes with a multiple of {p.tensor} GPUs, or a smaller parallel.tensor")


_IMPORT_CHECK = """
import json, sys
from hpctrain.user_code import load
for key, reference in json.loads(sys.argv[1]):
    load(reference, key)
"""


def check_user_code(references: list[tuple[str, str]], venv: str | None) -> None:
    """The user code the recipe names imports now, with the job's python (the --venv's, else
    this one) from this directory, as the job will: a missing module or a syntax error is
    exit 2 at submission, not a failed job after the queue."""
    python = str(Path(venv).expanduser() / "bin" / "python") if venv else sys.executable
    try:
        done = run_command([python, "-c", _IMPORT_CHECK, json.dumps(references)], 600)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"the user code of this recipe did not import within 10 minutes "
                          f"({python})") from None
    except OutputTooLarge as err:
        raise ConfigError(f"importing the user code of this recipe: {err} ({python})") \
            from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["(no output)"]
        message = next((line.removeprefix("hpctrain.errors.ConfigError: ") for line in
                        reversed(lines) if "ConfigError" in line), lines[-1])
        raise ConfigError(f"{message} [checked at submission with {python}, the job's "
                          "python]")


def _resumed_place(resume: str, sweep: bool) -> tuple[Path, str | None]:
    """(the run directory the job continues, the checkpoint its first start resumes from:
    None for a run directory, whose newest checkpoint is taken), checked now rather than after
    the queue. The job's own continuations take the newest checkpoint, as always."""
    if sweep:
        raise ConfigError(f"resume={resume} with --sweep: a sweep's elements are new runs; "
                          "submit the run to continue without --sweep")
    target = Path(resume).expanduser().absolute()
    if is_checkpoint(target):  # one checkpoint folder: run_dir/checkpoints/step_N
        return target.parent.parent, str(target)
    if not RunDir(target).list_checkpoints():
        raise ConfigError(f"resume={resume}: no checkpoint there; give a run directory with "
                          "checkpoints/ or one checkpoint folder (checkpoints/step_N)")
    return target, None


def check_places(job_name: str | None, options: dict) -> None:
    """What names a place: the job name becomes the run's folder; the venv and the container
    must exist (checked here, on the login node that shares their file system)."""
    try:
        plain_name(job_name, "--job-name")
    except ValueError as err:
        raise ConfigError(f"--job-name: {err}") from None
    venv = options.get("venv")
    if venv and not (Path(venv).expanduser() / "bin" / "activate").is_file():
        raise ConfigError(f"--venv {venv}: no virtual environment there ({venv}/bin/activate "
                          f"is missing); create it (python -m venv {venv}) or give its path")
    container = options.get("container")
    if container and not Path(container).expanduser().is_file():
        raise ConfigError(f"--container {container}: no such image file")


def check_fits(request: JobRequest, profile: Profile) -> None:
    """Refuse a job that no node of its partition can hold. sbatch accepts some of these (more
    CPUs per node than any node has) and they pend forever; where sinfo cannot be asked
    (not on the cluster) nothing is checked. GPUs need no check: sbatch refuses those."""
    partition = request.partition or profile.partition
    largest = scheduler_of(profile).largest_node_cpus(partition)
    if largest is None:
        return
    _, tasks = layout(request.gpus, request.nodes, profile)
    cpus = request.cpus_per_gpu or profile.cpus_per_gpu
    if tasks * cpus > largest:
        where = f"partition {partition}" if partition else "the default partition"
        raise ClusterError(
            f"this job could never start: {tasks} task(s) per node x {cpus} CPUs per task = "
            f"{tasks * cpus} CPUs per node, but the largest node of {where} has {largest}. "
            f"Use --cpus-per-gpu {max(1, largest // tasks)}, or the cluster profile that "
            f"matches this cluster (--cluster; profile in use: {profile.name})")


def submit(recipe: str | None = None, overrides: list[str] = (), gpus: int = 1,
           time_limit: str = "1:00:00", cluster: str | None = None, **options) -> Job:
    """Write the script into the run directory, submit it, remember the job."""
    request, script = plan(recipe, list(overrides), gpus, time_limit, cluster, **options)
    return send(request, script, get_profile(cluster))


def send(request: JobRequest, script: str, profile: Profile) -> Job:
    """Check that the job can start, write its script into its folder, submit it, remember
    it in the job ledger."""
    check_fits(request, profile)
    run = RunDir(request.run_dir)
    job_id = scheduler_of(profile).submit(write_script(request, script))
    remember_job(job_id, request.run_dir)
    write_whole(run.job_record, json.dumps({"job_id": job_id}) + "\n")
    return Job(job_id, request.run_dir)


def write_script(request: JobRequest, script: str) -> Path:
    """The job's script written into its run directory (made for it), where the script's own
    continuation and its logs expect it; its path."""
    request.run_dir.mkdir(parents=True, exist_ok=True)
    path = RunDir(request.run_dir).job_script
    write_whole(path, script)
    return path


def is_job_id(text: str) -> bool:
    """Whether `text` is a job id as the scheduler in use writes one (Slurm's 123456, or an
    array element's 123456_7)."""
    return bool(scheduler_of().JOB_ID.fullmatch(text))


def queue(name: str | None = None) -> list[dict]:
    """Your jobs in the queue."""
    return scheduler_of().queue(name=name)


def find_logs(job_or_text) -> list[Path]:
    """The log files of a job (a Job or an id), or those among your remembered runs' logs
    that contain `text`."""
    if isinstance(job_or_text, Job) or is_job_id(str(job_or_text)):
        job = job_or_text if isinstance(job_or_text, Job) else Job(str(job_or_text))
        return [p for p in (job.log_file(), job.log_file(err=True)) if p and p.is_file()]
    text = str(job_or_text)
    found = []
    for run in sorted({row["run_dir"] for row in read_ledger()}):
        for log in RunDir(Path(run)).job_logs(scheduler.job_logs()):
            if _holds(log, text.encode()):
                found.append(log)
    return found


def _holds(log: Path, text: bytes) -> bool:
    """Whether the log holds `text`, read a chunk at a time (the end of each kept for a text
    that spans two); False where it cannot be read (a link, not a regular file)."""
    carried = b""
    try:
        for chunk in chunks(log):
            if text in carried + chunk:
                return True
            carried = chunk[-len(text):]
    except (OSError, ValueError):
        return False
    return False


def allocations(job_ids: list[str]) -> list[dict] | None:
    """The scheduler's account of these jobs' every run (Scheduler.allocations), for
    `hpctrain goodput`; None where it keeps none or is not here to ask."""
    try:
        return scheduler_of().allocations(job_ids)
    except ClusterError:
        return None
