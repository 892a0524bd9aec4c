"""The body of the batch script `hpctrain submit` writes, the same for every scheduler: the
environment (modules, venv, conda), autotune first where asked, the `hpctrain run` command,
its launch and the continuation in a new job when the run saved and stopped early. What a
scheduler says in its own words (its array index, its job id, its restart count, its
launcher, how a job is submitted after another, what a job must not hand on) comes in
`ScriptWords`; its directives are its own module's (Slurm's: sbatch.py).

Safety: every value a user gives that goes into a command is shell-quoted, so a job name or
an override holding `$(...)`, backticks, quotes or newlines runs nothing.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from hpctrain.cluster.profiles import Profile
from hpctrain.cluster.request import JobRequest
from hpctrain.errors import ExitCode
from hpctrain.runs.directory import AUTOTUNE, SHELL_LEDGER, TUNED_RECIPE, RunDir


@dataclass(frozen=True)
class ScriptWords:
    """A scheduler's words in the script's shell lines.

    - `array_index`: this array element's index ("$SLURM_ARRAY_TASK_ID");
    - `job_id`, `element_id`: this job's id, an array element's ("$SLURM_JOB_ID");
    - `restarts`: how often the scheduler requeued this job ("${SLURM_RESTART_COUNT:-0}");
    - `launcher`: the command that starts one task per GPU ("srun");
    - `submit_after`: the command that submits the script as a job that starts once
      `$this_job` ends, printing its id; `{array}` takes `same_element` for an element, and
      `{script}` the script's path;
    - `same_element`: what makes that job the same array element ('--array="$element" ');
    - `own_variables`: a shell pattern (grep -E) of the variables this job must not hand on
      to the next one, and `kept_variable` the one of them it must;
    - `launch_note`, `signal_notes`, `requeue_note`: the comments that say how the
      scheduler starts the tasks, signals them, and holds a requeued job.
    """

    array_index: str
    job_id: str
    element_id: str
    restarts: str
    launcher: str
    submit_after: str
    same_element: str
    own_variables: str
    kept_variable: str
    launch_note: str
    signal_notes: tuple[str, ...]
    requeue_note: tuple[str, ...]


def body(request: JobRequest, profile: Profile, run_dir: Path, words: ScriptWords) \
        -> list[str]:
    """The script's lines after its directives: the environment, then the command."""
    lines = []
    environment = _environment(request, profile)
    if environment:
        lines += ["", *environment]
    return lines + ["", *_command(request, run_dir, words)]


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


def _command(request: JobRequest, run_dir: Path, words: ScriptWords) -> list[str]:
    """The script's body: which python, what a sweep or a resume sets, the launch, and the
    continuation in a new job when the run stopped early."""
    python, which = request.python()
    lines, command = _run_command(request, run_dir, python, words)
    about, launch = _launch(request, python, command, words)
    return [f"# python: {which}", *lines, *_autotune(request, run_dir, python), *about,
            *_continuation(request, run_dir, launch, words)]


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


def _run_command(request: JobRequest, run_dir: Path, python: list[str],
                 words: ScriptWords) -> tuple[list[str], str]:
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
        lines.append(f'case "{words.array_index}" in')
        for index, element in enumerate(request.sweep):
            quoted = " ".join(shlex.quote(o) for o in element)
            lines.append(f"    {index}) ELEMENT=({quoted}) ;;")
        lines += ["esac", ""]
        where = [f"output_dir={run_dir}"]
    resume = ["resume=auto"]
    if request.resume_from:  # this checkpoint on the first start; a continuation: the newest
        lines += ["resume=auto",
                  f'[ $(( {words.restarts} + ${{HPCTRAIN_RESTARTS:-0}} )) -eq 0 ] && '
                  f'resume={shlex.quote(request.resume_from)}', ""]
        resume = []
    command = " ".join(shlex.quote(str(a)) for a in [
        *arguments, *where, *resume, f"preemption.max_requeues={request.max_requeues}"])
    if request.resume_from:
        command += ' "resume=$resume"'
    if request.sweep:
        command += f' "${{ELEMENT[@]}}" run_name="element-{words.array_index}"'
    return lines, command


def _launch(request: JobRequest, python: list[str], command: str, words: ScriptWords) \
        -> tuple[list[str], str]:
    """What the script starts in the background (the run under the launcher, or a search's
    worker), with the comment that says so."""
    if request.worker:  # the worker launches each trial itself
        worker = " ".join(shlex.quote(str(a)) for a in [*python, "-m", "hpctrain",
                                                       *request.worker])
        return ([f"# This element's worker runs trial after trial, each with {words.launcher} "
                 "(one task per", "# GPU) until the search's budget is spent."],
                f'{worker} --slot "{words.array_index}" &')
    return ([words.launch_note], f"{words.launcher} {command} &")


def _continuation(request: JobRequest, run_dir: Path, launch: str,
                  words: ScriptWords) -> list[str]:
    """The launch, the signals passed on to it, and the job that continues a run that saved
    and stopped early (noted in the job ledger)."""
    if request.array:  # an element continues alone, as a one-element array of the same index
        this_job = [f'    this_job="{words.element_id}"',
                    f'    element="{words.array_index}"']
        same_element = words.same_element
    else:
        this_job, same_element = [f'    this_job="{words.job_id}"'], ""
    script = shlex.quote(str(RunDir(run_dir).job_script))
    record = shlex.quote(json.dumps(str(run_dir)))
    submit = words.submit_after.format(array=same_element, script=script)
    return [
        "export HPCTRAIN_CONTINUES=script  # the continuation below is this script's job",
        *words.signal_notes,
        "trap 'kill -s USR1 \"$run\" 2>/dev/null' USR1",
        "trap 'terminated=1' TERM",
        launch,
        "run=$!",
        'while :; do wait "$run"; status=$?; kill -0 "$run" 2>/dev/null || break; done',
        f"# {int(ExitCode.STOPPED)}: saved and stopped early (preemption signal or time limit); "
        f"{int(ExitCode.HUNG)}: hung (its",
        "# stacks kept, the last checkpoint too). Continue in a new job",
        *words.requeue_note,
        f'restarts=$(( {words.restarts} + ${{HPCTRAIN_RESTARTS:-0}} ))',
        f'if {{ [ "$status" -eq {int(ExitCode.STOPPED)} ] || [ "$status" -eq '
        f'{int(ExitCode.HUNG)} ]; }} && [ -z "$terminated" ] && '
        f'[ "$restarts" -lt {request.max_requeues} ]; then',
        *this_job,
        f"    # this job's variables must not reach the next one ({words.kept_variable}, if "
        "set, must)",
        f'    unset $(compgen -e | grep -E "{words.own_variables}" | grep -vx '
        f'{words.kept_variable})',
        f'    next=$(HPCTRAIN_RESTARTS=$((restarts + 1)) {submit})',
        '    if [ -n "$next" ]; then',
        '        echo "hpctrain: continuing in job ${next%%;*} once job $this_job ends" >&2',
        f'        printf \'{{"job_id": "%s", "continues": "%s", "run_dir": %s}}\\n\' '
        f'"${{next%%;*}}" "$this_job" {record} >> "{SHELL_LEDGER}"',
        "    fi",
        "fi",
        'exit "$status"',
    ]
