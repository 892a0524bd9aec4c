"""One candidate measured: a short real run of the recipe with the candidate's settings, in a
process of its own (`hpctrain run`, the same data path, DataLoader workers and all), so that
an out-of-memory error, a crash or a hang costs that trial and never the search: a trial past
its time is killed with its whole process group and recorded as such.

The run trains `warmup + measure` optimiser steps and logs every `log_every`; the figures are
the training records after the warm-up steps (compilation, cuDNN's autotuning, the workers'
first batches: one-time costs, counted apart), data waits included: samples per second over
the measured steps as hpctrain's own clock timed them. The trial's evaluation and final
checkpoint are outside its steps' time, as in every run.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpctrain.monitor import lifeline
from hpctrain.readers import tail_text
from hpctrain.runs.directory import RunDir
from hpctrain.runs.identity import read_identity
from hpctrain.tune.space import override
from hpctrain.tune.worker import hpctrain_run
from hpctrain.writers import not_a_link, open_fresh, own_folder

TRIALS = "trials"  # in the autotune folder: one run directory per trial
TRIAL_NAME = re.compile(r"trial-(\d+)(?:\.log)?")  # a trial's run directory, or its log
LOGS = "logs"
OUT_OF_MEMORY = ("out of memory", "outofmemoryerror")
KILL_GRACE_SECONDS = 10  # after SIGTERM, before SIGKILL


@dataclass(frozen=True)
class Plan:
    """How every trial of one search runs."""
    recipe: str | None
    overrides: list[str]  # the user's own, given to every trial
    folder: Path
    warmup: int = 10
    measure: int = 20
    log_every: int = 5
    launcher: tuple[str, ...] = ()  # what starts a trial's processes: torchrun, a scheduler's, none


@dataclass
class Trial:
    number: int
    choices: dict[str, str]  # knob -> the choice's label
    settings: list[str]  # key=value, what makes it
    status: str = "measured"  # measured | failed | out of memory | timed out | pruned | ...
    why: str = ""
    steps: int = 0  # measured steps
    step_seconds: float | None = None
    samples_per_second: float | None = None
    data_wait: float | None = None  # share of the measured steps' time
    peak_memory_bytes: int | None = None
    one_time_seconds: float | None = None  # start-up and the warm-up beyond its steady steps
    predicted_run_seconds: float | None = None  # one-time + the run's steps at this pace
    wall_seconds: float = 0.0
    run_dir: str | None = None
    log: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return self.status == "measured"

    def to_json(self) -> dict:
        return asdict(self)


@contextmanager
def held_folder(folder: Path):
    """The autotune folder held for one search's life, as a run holds its run directory
    (runs/lock.py: run.lock, refused while another living autotune holds it, taken over from
    one that is gone, such as an earlier start of the same job; no link in the folder)."""
    from hpctrain.cluster.environment import detect
    from hpctrain.runs.lock import claim

    env = detect()
    lock = claim(folder, env.job_id, env.restart_count, "--dir", instead="--dir")
    lock.keep_folders()
    try:
        yield
    finally:
        lock.release()


def next_number(folder: Path) -> int:
    """The first trial number no earlier search in `folder` used: a second autotune into the
    folder (a job requeued while it tuned) numbers its trials after the first one's, where it
    ran into their run directories and failed."""
    used = [int(found.group(1)) for path in [*(folder / TRIALS).glob("trial-*"),
                                             *(folder / LOGS).glob("trial-*.log")]
            if (found := TRIAL_NAME.fullmatch(path.name))]
    return max(used, default=-1) + 1


def trial_settings(plan: Plan, name: str, measure: int) -> list[str]:
    """What makes a run a trial: its place, its length, and nothing it need not do (no
    report, trackers, periodic evaluation or checkpoints, requeue)."""
    return [f"output_dir={plan.folder / TRIALS}", f"run_name={name}", override("resume", None),
            f"train.max_steps={plan.warmup + measure}", f"train.log_every={plan.log_every}",
            "report=false", "tracking.sinks=[]", "train.eval_every_epochs=1000000",
            override("checkpoint.every", None), override("checkpoint.every_steps", None),
            "checkpoint.every_epochs=1000000", "preemption.requeue=never"]


def run_trial(plan: Plan, trial: Trial, measure: int, limit_seconds: float) -> Trial:
    """Run `trial` for `plan.warmup + measure` steps, at most `limit_seconds`; fills its
    figures, or its status and why."""
    name = f"trial-{trial.number:02d}"
    not_a_link(own_folder(plan.folder / TRIALS) / name)  # the trial's run stays in the folder
    log_path = own_folder(plan.folder / LOGS) / f"{name}.log"
    command = [*plan.launcher, *hpctrain_run(plan.recipe, [
        *plan.overrides, *trial.settings, *trial_settings(plan, name, measure)])]
    started = time.perf_counter()
    with open_fresh(log_path) as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env={**os.environ, **lifeline.environment()})
        try:
            code = child.wait(timeout=limit_seconds)
        except subprocess.TimeoutExpired:
            _kill_group(child, bool(plan.launcher))
            code = None
        except BaseException:  # Ctrl-C: the trial, in a session of its own, did not get it
            _kill_group(child, bool(plan.launcher))
            raise
    trial.wall_seconds = time.perf_counter() - started
    trial.run_dir, trial.log = str(plan.folder / TRIALS / name), str(log_path)
    if code is None:
        trial.status, trial.why = "timed out", f"no end within {limit_seconds:.0f} s"
    elif code != 0:
        tail = _last_lines(log_path)
        trial.status = "out of memory" if any(w in tail.lower() for w in OUT_OF_MEMORY) \
            else "failed"
        trial.why = f"exit {code}: {_error_line(tail)}"
    else:
        _read_figures(trial, Path(trial.run_dir), plan)
    return trial


def _kill_group(child: subprocess.Popen, launched: bool) -> None:
    """The trial and its DataLoader workers, all of them (a hung step holds its workers);
    where a launcher started it, SIGTERM first, which a scheduler's launcher passes on to its
    tasks on every node and torchrun to its processes, then SIGKILL to what is left."""
    first = (signal.SIGTERM, signal.SIGKILL) if launched else (signal.SIGKILL,)
    for number, signal_number in enumerate(first):
        try:
            os.killpg(child.pid, signal_number)
        except ProcessLookupError:
            break
        try:
            child.wait(timeout=KILL_GRACE_SECONDS if number < len(first) - 1 else None)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(child.pid, signal.SIGKILL)  # workers the launcher left behind
    except ProcessLookupError:
        pass
    child.wait()


def _last_lines(path: Path, count: int = 20) -> str:
    lines = [line for line in tail_text(path).splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def _error_line(tail: str) -> str:
    """The last line that says it is an error (hpctrain's one-line verdicts, a traceback's
    last), else the last line, cut at 300 characters."""
    lines = tail.splitlines() or ["no output"]
    said = [line for line in lines if "error" in line.lower()]
    line = (said or lines)[-1].strip()
    return line if len(line) <= 300 else line[:297] + "..."


def _read_figures(trial: Trial, run_dir: Path, plan: Plan) -> None:
    run = RunDir(run_dir)
    records, _, damage = run.read_metrics()
    summary = run.read_summary() or {}
    identity, _ = read_identity(run_dir)
    train = [r for r in records if r.get("kind") == "train"]
    intervals = [(r, r["step"] - before, before) for r, before in _with_previous_step(train)]
    measured = [(r, steps) for r, steps, before in intervals if before >= plan.warmup]
    warmup = [(r, steps) for r, steps, before in intervals if before < plan.warmup]
    if damage or not measured or summary.get("status") != "completed":
        trial.status = "failed"
        trial.why = damage or f"no measured steps (status {summary.get('status')})"
        return
    seconds = sum(r["seconds_per_step"] * steps for r, steps in measured)
    trial.steps = sum(steps for _, steps in measured)
    trial.step_seconds = seconds / trial.steps
    batch = summary.get("global_batch_size") or 0
    trial.samples_per_second = batch * trial.steps / seconds
    trial.data_wait = sum(r["data_wait_fraction"] * r["seconds_per_step"] * steps
                          for r, steps in measured) / seconds
    trial.peak_memory_bytes = summary.get("peak_memory_bytes")
    warm_seconds = sum(r["seconds_per_step"] * steps for r, steps in warmup)
    warm_steps = sum(steps for _, steps in warmup)
    split = ((identity or {}).get("starts") or [{}])[-1].get("split") or {}
    trial.one_time_seconds = split.get("startup", 0.0) + max(
        0.0, warm_seconds - warm_steps * trial.step_seconds)
    trial.extra["steps_per_epoch"] = _steps_per_epoch(train)
    _in_the_task_units(trial, summary)


def _in_the_task_units(trial: Trial, summary: dict) -> None:
    """The measured steps' throughput in the task's own unit (tokens/s) and their MFU where
    the run's summary gives them: its figures scaled by the measured share of its pace."""
    whole = summary.get("samples_per_second")
    if not whole:
        return
    scale = trial.samples_per_second / whole
    for key, value in summary.items():
        if key.endswith("_per_second") and key != "samples_per_second" and \
                isinstance(value, (int, float)):
            trial.extra[key] = value * scale
    if isinstance(summary.get("mfu"), (int, float)):
        trial.extra["mfu"] = summary["mfu"] * scale


def run_steps(config, trial: Trial) -> int:
    """The optimiser steps of the whole run `config` describes: its max_steps, else its
    epochs at the steps per epoch the trial's records show."""
    return config.train.max_steps or math.ceil(
        config.train.epochs * (trial.extra.get("steps_per_epoch") or 1))


def _with_previous_step(records: list[dict]):
    before = 0
    for record in records:
        yield record, before
        before = record["step"]


def _steps_per_epoch(records: list[dict]) -> float | None:
    """From a record's step and epoch (epoch = step / steps per epoch)."""
    last = next((r for r in reversed(records) if r.get("epoch")), None)
    return last["step"] / last["epoch"] if last else None
