"""The sbatch script `hpctrain submit` writes: plain text, one request in, one script out.

Safety: every value a user gives is either checked against a strict pattern (what goes into
`#SBATCH` lines, which sbatch reads itself and where a newline would start a shell line) or
shell-quoted (what goes into commands). A job name or override holding `$(...)`, backticks,
quotes or newlines therefore runs nothing.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

from hpctrain.cluster.profiles import Profile
from hpctrain.cluster.request import JobRequest, layout, time_seconds
from hpctrain.errors import ConfigError, ExitCode
from hpctrain.runs.directory import AUTOTUNE, SHELL_LEDGER, TUNED_RECIPE, RunDir

JOB_LOG = "slurm-{job}.{stream}"  # a job's log in its run directory (slurm.JOB_LOG); {job}:
# the id, or what Slurm fills in (%j, %A_%a); {stream}: out | err
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
    environment = _environment(request, profile)
    if environment:
        lines += ["", *environment]
    lines += ["", *_command(request, run_dir)]
    return "\n".join(lines) + "\n"


def _per_node_mem(per_gpu: str, gpus: int) -> str:
    match = re.fullmatch(r"(\d+)([KMGT]?)", per_gpu)
    if not match:
        raise ConfigError(f"mem_per_gpu {per_gpu!r}: use e.g. 60G")
    return f"{int(match.group(1)) * gpus}{match.group(2)}"


def _environment(request: JobRequest, profile: Profile) -> list[str]:
    """Modules, venv, conda: each must take, or the job stops at once (exit 2) instead of
    running whatever python is on PATH."""
    lines = []
    modules = profile.modules + request.modules
    if modules:
        lines.append("module purge")
        lines += [_or_stop(f"module load {shlex.quote(m)}", f"module {m} did not load")
                  for m in modules]
    if request.venv:
        venv = shlex.quote(str(Path(request.venv).expanduser()))
        lines.append(_or_stop(f"source {venv}/bin/activate",
                              f"--venv {request.venv} cannot be activated"))
    if request.conda:
        lines.append(_or_stop(f"conda activate {shlex.quote(request.conda)}",
                              f"--conda {request.conda} cannot be activated"))
    return lines


def _or_stop(command: str, problem: str) -> str:
    return f"{command} || {{ echo {shlex.quote(f'hpctrain: {problem}')} >&2; exit 2; }}"


def _command(request: JobRequest, run_dir: Path) -> list[str]:
    """The script's body: which python, what a sweep or a resume sets, the launch, and the
    continuation in a new job when the run stopped early."""
    python, which = request.python()
    lines, command = _run_command(request, run_dir, python)
    about, launch = _launch(request, python, command)
    return [f"# python: {which}", *lines, *_autotune(request, run_dir, python), *about,
            *_continuation(request, run_dir, launch)]


def _autotune(request: JobRequest, run_dir: Path, python: list[str]) -> list[str]:
    """`hpctrain autotune` on this job's GPUs (each trial a step of the launcher), once: a
    continuation trains what it picked."""
    if request.autotune is None:
        return []
    folder = run_dir / AUTOTUNE
    command = " ".join(shlex.quote(str(a)) for a in [
        *python, "-m", "hpctrain", "autotune", *([request.recipe] if request.recipe else []),
        *request.overrides, "--dir", folder, "--processes", request.gpus, *request.autotune])
    return ["# autotune first: the fastest settings measured on this job's GPUs, each trial a",
            "# step of its own; the run trains its pick (a continuation does not tune again)",
            f"if [ ! -f {shlex.quote(str(folder / TUNED_RECIPE))} ]; then",
            f"    {command} || exit $?", "fi", ""]


def _run_command(request: JobRequest, run_dir: Path, python: list[str]) \
        -> tuple[list[str], str]:
    """The lines that set what the run needs (PYTHONPATH for user code, the sweep element,
    the checkpoint of a first start), and the `hpctrain run` command line."""
    arguments = [*python, "-m", "hpctrain", "run", *([request.recipe] if request.recipe else []),
                 *request.overrides]
    if request.autotune is not None:  # the pick holds the recipe and its settings
        arguments = [*python, "-m", "hpctrain", "run", run_dir / AUTOTUNE / TUNED_RECIPE]
    where = [f"output_dir={run_dir.parent}", f"run_name={run_dir.name}"]
    lines = []
    if request.user_code and request.workdir:  # package.module:fn from the submit directory
        lines += [f"export PYTHONPATH={shlex.quote(str(request.workdir))}"
                  "${PYTHONPATH:+:$PYTHONPATH}", ""]
    if request.sweep:  # one run directory per element, inside the sweep's directory
        lines.append('case "$SLURM_ARRAY_TASK_ID" in')
        for index, element in enumerate(request.sweep):
            quoted = " ".join(shlex.quote(o) for o in element)
            lines.append(f"    {index}) ELEMENT=({quoted}) ;;")
        lines += ["esac", ""]
        where = [f"output_dir={run_dir}"]
    resume = ["resume=auto"]
    if request.resume_from:  # this checkpoint on the first start; a continuation: the newest
        lines += ["resume=auto",
                  '[ $(( ${SLURM_RESTART_COUNT:-0} + ${HPCTRAIN_RESTARTS:-0} )) -eq 0 ] && '
                  f'resume={shlex.quote(request.resume_from)}', ""]
        resume = []
    command = " ".join(shlex.quote(str(a)) for a in [
        *arguments, *where, *resume, f"preemption.max_requeues={request.max_requeues}"])
    if request.resume_from:
        command += ' "resume=$resume"'
    if request.sweep:
        command += ' "${ELEMENT[@]}" run_name="element-$SLURM_ARRAY_TASK_ID"'
    return lines, command


def _launch(request: JobRequest, python: list[str], command: str) -> tuple[list[str], str]:
    """What the script starts in the background (the run under srun, or a search's worker),
    with the comment that says so."""
    if request.worker:  # the worker sruns each trial itself
        worker = " ".join(shlex.quote(str(a)) for a in [*python, "-m", "hpctrain",
                                                       *request.worker])
        return (["# This element's worker runs trial after trial, each with srun (one task per",
                 "# GPU) until the search's budget is spent."],
                f'{worker} --slot "$SLURM_ARRAY_TASK_ID" &')
    return (["# One task per GPU; hpctrain reads the layout from srun (no MASTER_ADDR to "
             "export)."], f"srun {command} &")


def _continuation(request: JobRequest, run_dir: Path, launch: str) -> list[str]:
    """The launch, the signals passed on to it, and the job that continues a run that saved
    and stopped early (noted in the job ledger)."""
    if request.array:  # an element continues alone, as a one-element array of the same index
        this_job = ['    this_job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
                    '    element="$SLURM_ARRAY_TASK_ID"']
        same_element = '--array="$element" '
    else:
        this_job, same_element = ['    this_job="$SLURM_JOB_ID"'], ""
    script = shlex.quote(str(RunDir(run_dir).job_script))
    record = shlex.quote(json.dumps(str(run_dir)))
    return [
        "export HPCTRAIN_CONTINUES=script  # the continuation below is this script's job",
        "# USR1 to this shell (scancel --batch --signal=USR1, --signal=B:USR1@300) goes on to",
        "# the run, which saves; srun runs in the background so that the shell takes it at once.",
        "# SIGTERM (scancel, or Slurm preempting and requeueing the job) reaches the run's tasks",
        "# from Slurm itself, and they save within KillWait; it is not passed on (srun would",
        "# kill its tasks), and such a job is not continued here.",
        "trap 'kill -s USR1 \"$run\" 2>/dev/null' USR1",
        "trap 'terminated=1' TERM",
        launch,
        "run=$!",
        'while :; do wait "$run"; status=$?; kill -0 "$run" 2>/dev/null || break; done',
        f"# {int(ExitCode.STOPPED)}: saved and stopped early (preemption signal or time limit); "
        f"{int(ExitCode.HUNG)}: hung (its",
        "# stacks kept, the last checkpoint too). Continue in a new job",
        "# that may start as soon as this one ends (a requeued job waits until its credential",
        "# expires, AuthInfo cred_expire, 2 minutes by default), and note it in the job ledger.",
        'restarts=$(( ${SLURM_RESTART_COUNT:-0} + ${HPCTRAIN_RESTARTS:-0} ))',
        f'if {{ [ "$status" -eq {int(ExitCode.STOPPED)} ] || [ "$status" -eq '
        f'{int(ExitCode.HUNG)} ]; }} && [ -z "$terminated" ] && '
        f'[ "$restarts" -lt {request.max_requeues} ]; then',
        *this_job,
        "    # this job's variables must not reach the next one (SLURM_CONF, if set, must)",
        '    unset $(compgen -e | grep -E "^(SLURM|SBATCH|SRUN|SALLOC)_" | grep -vx SLURM_CONF)',
        f'    next=$(HPCTRAIN_RESTARTS=$((restarts + 1)) sbatch --parsable {same_element}'
        f'--dependency=afterany:"$this_job" {script})',
        '    if [ -n "$next" ]; then',
        '        echo "hpctrain: continuing in job ${next%%;*} once job $this_job ends" >&2',
        f'        printf \'{{"job_id": "%s", "continues": "%s", "run_dir": %s}}\\n\' '
        f'"${{next%%;*}}" "$this_job" {record} >> "{SHELL_LEDGER}"',
        "    fi",
        "fi",
        'exit "$status"',
    ]
