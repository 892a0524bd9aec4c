"""The sbatch script `hpctrain submit` writes: plain text, one request in, one script out.
Here Slurm's part: its `#SBATCH` directives and its words in the shell lines (`WORDS`); the
body, the same for every scheduler, is batch_script.py's.

Safety: every value a user gives is either checked against a strict pattern (what goes into
`#SBATCH` lines, which sbatch reads itself and where a newline would start a shell line) or
shell-quoted (what goes into commands: batch_script.py). A job name or override holding
`$(...)`, backticks, quotes or newlines therefore runs nothing.
"""

from __future__ import annotations

import re
import shlex
import time

from hpctrain.cluster.batch_script import ScriptWords, body
from hpctrain.cluster.profiles import Profile
from hpctrain.cluster.request import JobRequest, layout, time_seconds
from hpctrain.errors import ConfigError
from hpctrain.runs.directory import RunDir

JOB_LOG = "slurm-{job}.{stream}"  # a job's log in its run directory (slurm.JOB_LOG); {job}:
# the id, or what Slurm fills in (%j, %A_%a); {stream}: out | err
WORDS = ScriptWords(
    array_index="$SLURM_ARRAY_TASK_ID", job_id="$SLURM_JOB_ID",
    element_id="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}",
    restarts="${SLURM_RESTART_COUNT:-0}", launcher="srun",
    submit_after='sbatch --parsable {array}--dependency=afterany:"$this_job" {script}',
    same_element='--array="$element" ', own_variables="^(SLURM|SBATCH|SRUN|SALLOC)_",
    kept_variable="SLURM_CONF",
    launch_note="# One task per GPU; hpctrain reads the layout from srun (no MASTER_ADDR to "
                "export).",
    signal_notes=(
        "# USR1 to this shell (scancel --batch --signal=USR1, --signal=B:USR1@300) goes on to",
        "# the run, which saves; srun runs in the background so that the shell takes it at once.",
        "# SIGTERM (scancel, or Slurm preempting and requeueing the job) reaches the run's tasks",
        "# from Slurm itself, and they save within KillWait; it is not passed on (srun would",
        "# kill its tasks), and such a job is not continued here."),
    requeue_note=(
        "# that may start as soon as this one ends (a requeued job waits until its credential",
        "# expires, AuthInfo cred_expire, 2 minutes by default), and note it in the job ledger."))
# what may stand in an #SBATCH value: no spaces, quotes, newlines or shell syntax
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")


def _clock(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    text = time.strftime("%H:%M:%S", time.gmtime(rest))
    return f"{days}-{text}" if days else text


def _safe(option: str, value) -> str:
    text = str(value)
    if not SAFE_VALUE.match(text):
        raise ConfigError(f"{option} {text!r}: only letters, digits and _.,:@%+=/- are "
                          "allowed here (the value goes into an #SBATCH line)")
    return text


def _job_name(request: JobRequest) -> str:
    if request.job_name:
        return _safe("--job-name", request.job_name)
    return request.run_dir.name


def render(request: JobRequest, profile: Profile) -> str:
    """The whole sbatch script for `request` on `profile`."""
    seconds = time_seconds(request.time)
    if profile.max_time and seconds > time_seconds(profile.max_time):
        raise ConfigError(f"--time {request.time} exceeds {profile.name}'s limit of "
                          f"{profile.max_time}; use a shorter --time (the run requeues "
                          "itself and continues) or another --qos")
    nodes, per_node = layout(request.gpus, request.nodes, profile)
    if request.cpus_per_gpu is not None and request.cpus_per_gpu < 1:
        raise ConfigError(f"--cpus-per-gpu {request.cpus_per_gpu}: give 1 or more")
    if request.max_requeues < 0:
        raise ConfigError(f"--max-requeues {request.max_requeues}: give 0 (never) or more")
    cpus = request.cpus_per_gpu or profile.cpus_per_gpu
    lead = min(profile.signal_lead_seconds, max(30, seconds // 10))
    run_dir = request.run_dir.expanduser().absolute()
    directives = [
        ("job-name", _job_name(request)),
        ("nodes", nodes),
        ("ntasks-per-node", per_node),
        ("gres", f"gpu:{per_node}"),
        ("cpus-per-task", cpus),
        ("hint", "nomultithread"),
        ("time", _clock(seconds)),
    ]
    account = request.account and _safe("--account", request.account) + profile.account_suffix
    for option, value in (("account", account),
                          ("partition", request.partition or profile.partition),
                          ("qos", request.qos or profile.qos),
                          ("constraint", request.constraint or profile.constraint),
                          ("mem", request.mem or (profile.mem_per_gpu and
                                                  _per_node_mem(profile.mem_per_gpu, per_node)))):
        if value:
            directives.append((option, _safe(f"--{option}", value)))
    job = "%A_%a" if request.array else "%j"  # Slurm fills in the job (array element) id
    if request.workdir:  # where relative paths and your modules are found, as at submission
        directives.append(("chdir", _safe("the submit directory", request.workdir)))
    if request.array:
        directives.append(("array", f"0-{request.array - 1}"))
    directives += [
        ("signal", f"USR1@{lead}"),  # to the job steps (no B:): every rank gets it
        ("requeue", None),
        ("open-mode", "append"),
        ("output", f"{_safe('run directory', run_dir)}/{JOB_LOG.format(job=job, stream='out')}"),
        ("error", f"{run_dir}/{JOB_LOG.format(job=job, stream='err')}"),
    ]
    lines = ["#!/bin/bash",
             f"# Written by 'hpctrain submit' for the {profile.name} cluster profile.",
             "# Submit it again with: sbatch " + shlex.quote(str(RunDir(run_dir).job_script))]
    for option, value in directives:
        lines.append(f"#SBATCH --{option}" + ("" if value is None else f"={value}"))
    for line in request.script_options:
        if "\n" in line or "\r" in line:
            raise ConfigError("--extra-sbatch: one directive per option, without newlines")
        lines.append("#SBATCH " + _safe("--extra-sbatch", line.removeprefix("#SBATCH").strip()))
    return "\n".join([*lines, *body(request, profile, run_dir, WORDS)]) + "\n"


def _per_node_mem(per_gpu: str, gpus: int) -> str:
    match = re.fullmatch(r"(\d+)([KMGT]?)", per_gpu)
    if not match:
        raise ConfigError(f"mem_per_gpu {per_gpu!r}: use e.g. 60G")
    return f"{int(match.group(1)) * gpus}{match.group(2)}"


