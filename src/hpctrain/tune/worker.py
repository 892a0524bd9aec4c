"""A tune worker: takes trials from the study until the budget is spent, and runs each as a
normal `hpctrain run` in its own run directory (SEARCH/trial-NNNN), under torchrun locally or
the scheduler's launcher inside an element of its array job.

Each worker has a slot (the array element, or a local thread's number) and a claim file
(SEARCH/claims/SLOT.json) naming the trial it runs; the worker touches the file while the
trial runs: the trial's heartbeat.
- A trial stopped early (preemption signal or time limit: exit 75) stays RUNNING and claimed;
  the slot's next job resumes the same trial in the same run directory.
- A trial whose heartbeat has been silent for STALE_SECONDS (its node died, or its slot waits
  in the queue) is failed and retried by whichever worker takes the next trial: the retry has
  the same parameters and continues the same run directory from its last checkpoint.
- A trial that crashes is marked failed and the search goes on; after FAILURES_IN_A_ROW
  crashes in a row the worker stops, since something is wrong with every trial.
Taking a trial happens under a lock in the search folder (a symlink, safe on NFS and Lustre),
so that two workers never overrun the budget or take the same retry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.config.base import plain_name
from hpctrain.errors import ConfigError, ExitCode
from hpctrain.monitor import lifeline
from hpctrain.readers import COUNT, Kind, KiB, field_problem, json_mapping, tail_text
from hpctrain.runs.directory import RunDir
from hpctrain.runs.identity import Heartbeat
from hpctrain.tune.space import Parameter, override, parse_all, shown
from hpctrain.tune.study import Search, open_study, read_search
from hpctrain.writers import not_a_link, open_appending, own_folder, write_whole

CLAIMS = "claims"
CLAIM_CAP = 64 * KiB  # a claim is some hundred bytes
LOGS = "logs"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 600.0
FAILURES_IN_A_ROW = 3


def _plain(name) -> bool:
    try:
        return isinstance(name, str) and plain_name(name, "a trial's run") is not None
    except ValueError:
        return False


RUN_NAME = Kind("a plain folder name", _plain)  # a trial's run directory, inside the search
CLAIM_RULES = {"trial": COUNT, "run_name": RUN_NAME}


@dataclass
class Launch:
    """How a trial's training starts: its command's prefix (torchrun, the scheduler's
    launcher, or nothing) and
    what its environment adds."""

    prefix: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    cpus: list[int] | None = None  # local: the cores this slot's trials run on
    # what stops a trial with a checkpoint, when not the recipe's preemption signal: torchrun
    # passes SIGTERM on to its processes (which save), while USR1 would end torchrun alone
    stop_signal: int | None = None


def torchrun(processes: int) -> list[str]:
    """The prefix that starts a command as `processes` torchrun processes on this machine;
    none for one process."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(processes), "--no-python"] if processes > 1 else []


def hpctrain_run(recipe: str | None, overrides: list[str]) -> list[str]:
    """`hpctrain run` of `recipe` with `overrides`, by this interpreter."""
    return [sys.executable, "-m", "hpctrain", "run", *([recipe] if recipe else []), *overrides]


@dataclass
class Claim:
    trial: int
    run_name: str
    params: dict
    resumed: bool = False


def claim_file(folder: Path, slot: str) -> Path:
    return Path(folder) / CLAIMS / f"{slot}.json"


def _read_claim(path: Path) -> dict | None:
    """A claim as _write_claim wrote it; None when absent or damaged (a link, cut short, a
    field of another kind): a slot without a claim takes a new trial."""
    claim = json_mapping(path, CLAIM_CAP)
    return claim if claim is not None and field_problem(
        claim, CLAIM_RULES, tuple(CLAIM_RULES)) is None else None


def _heartbeats(folder: Path) -> dict[int, float]:
    """trial number -> the newest heartbeat of a claim naming it."""
    beats: dict[int, float] = {}
    for path in (Path(folder) / CLAIMS).glob("*.json"):
        claim = _read_claim(path)
        try:
            when = path.lstat().st_mtime
        except OSError:
            continue
        if claim is not None:
            beats[claim["trial"]] = max(beats.get(claim["trial"], 0.0), when)
    return beats


def trial_run_name(trial) -> str:
    """The run directory of `trial` inside the search's folder: trial-NNNN, or the one its
    retry continues (its user attribute). A journal naming another place (a path, a hidden
    name) is damaged: the trial's log and run would be written there."""
    name = trial.user_attrs.get("run_name", f"trial-{trial.number:04d}")
    if not RUN_NAME.holds(name):
        raise ConfigError(f"the search's study names {str(name)[:80]!r} as trial "
                          f"{trial.number}'s run directory, not a plain folder name inside "
                          "the search's folder: its journal is damaged")
    return name


def tell(study, number: int, value: float | None = None, state=None) -> None:
    """The trial's end into the study. The grid sampler asks the study to stop once its grid
    is spent, which only works inside Optuna's own loop: the end is stored all the same."""
    try:
        study.tell(number, value, state=state, skip_if_finished=True)
    except RuntimeError as err:
        if "Study.stop" not in str(err):
            raise


def budget_used(trials: list) -> int:
    """Trials that count against the budget: all that started, a failed trial and its retry
    counted once."""
    from optuna.trial import TrialState

    started = [t for t in trials if t.state != TrialState.WAITING]
    return len(started) - sum(1 for t in started if "retry_of" in t.user_attrs)


def fail_stale(study, folder: Path, now: float | None = None,
               trials: list | None = None) -> list[int]:
    """Fail the RUNNING trials (of `trials`, the study's as just read, where given) whose
    heartbeat is older than STALE_SECONDS and queue a retry of each (same parameters, same
    run directory); the numbers failed."""
    from optuna.trial import TrialState

    now = time.time() if now is None else now
    beats = _heartbeats(folder)
    failed = []
    running = [t for t in trials if t.state == TrialState.RUNNING] if trials is not None \
        else study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in running:
        last = beats.get(trial.number, trial.datetime_start.timestamp())
        if now - last <= STALE_SECONDS:
            continue
        tell(study, trial.number, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={
            "retry_of": trial.number, "run_name": trial_run_name(trial)},
            skip_if_exists=False)
        failed.append(trial.number)
    return failed


def take_trial(study, search: Search, folder: Path, slot: str,
               parameters: list[Parameter]) -> Claim | None:
    """The trial this slot runs next: its own unfinished one, else a retry, else a new one
    while the budget lasts; None when there is nothing left to take. Under the lock only
    what decides which trial it is (one read of the trials, the stale ones failed, the trial
    created); its parameters are sampled after the lock is released: TPE's proposal reads
    every trial again and fits its estimators, which 32 workers waited for in turn."""
    from optuna.storages.journal import JournalFileSymlinkLock
    from optuna.trial import TrialState

    from hpctrain.tune.study import LOCK_GRACE_SECONDS

    lock = JournalFileSymlinkLock(str(own_folder(Path(folder) / CLAIMS) / "take"),
                                  grace_period=LOCK_GRACE_SECONDS)
    lock.acquire()
    try:
        mine = _read_claim(claim_file(folder, slot))
        trials = study.get_trials(deepcopy=False)
        if mine is not None and mine["trial"] < len(trials) and \
                trials[mine["trial"]].state == TrialState.RUNNING:
            own = trials[mine["trial"]]
            _write_claim(folder, slot, own.number, mine["run_name"])
            return Claim(own.number, mine["run_name"], own.params, resumed=True)
        if fail_stale(study, folder, trials=trials):
            trials = study.get_trials(deepcopy=False)
        waiting = any(t.state == TrialState.WAITING for t in trials)
        if not waiting and budget_used(trials) >= search.trials:
            claim_file(folder, slot).unlink(missing_ok=True)
            return None
        trial = study.ask()
        run_name = trial_run_name(trial)
        trial.set_user_attr("run_name", run_name)
        _write_claim(folder, slot, trial.number, run_name)
    finally:
        lock.release()
    return Claim(trial.number, run_name, {p.key: p.suggest(trial) for p in parameters},
                 resumed="retry_of" in trial.user_attrs)


def _write_claim(folder: Path, slot: str, number: int, run_name: str) -> None:
    write_whole(claim_file(folder, slot), json.dumps({
        "trial": number, "run_name": run_name, "slot": slot, "host": os.uname().nodename,
        "pid": os.getpid()}) + "\n")


class Worker:
    """One slot's loop: take a trial, run it, tell the study, until nothing is left or a
    stop signal came. `say` prints a line for people."""

    def __init__(self, folder: Path, slot: str, launch: Launch,
                 say: Callable[[str], None] = print, stop_signal: int = signal.SIGUSR1):
        self.folder, self.slot, self.launch, self.say = Path(folder), slot, launch, say
        self.stop_signal = stop_signal
        self.search = read_search(self.folder)
        self.parameters = parse_all(self.search.space)
        self.stopping = threading.Event()
        self.child: subprocess.Popen | None = None

    def stop(self, forward: bool = True) -> None:
        """Stop after the running trial has saved: its training gets the stop signal (when
        `forward`; under Slurm a SIGTERM reaches it from Slurm itself)."""
        self.stopping.set()
        child = self.child
        if forward and child is not None and child.poll() is None:
            child.send_signal(self.launch.stop_signal or self.stop_signal)

    def run(self) -> int:
        """DONE: the budget is spent; STOPPED: stopped early (its trial continues later);
        FAILED: trials kept crashing."""
        slot_number = int(self.slot) if self.slot.isdigit() else 0
        study = open_study(self.folder, self.search, slot_number, self.parameters)
        crashes = 0
        while not self.stopping.is_set():
            claim = take_trial(study, self.search, self.folder, self.slot, self.parameters)
            if claim is None:
                return ExitCode.DONE
            outcome = self._run_trial(claim)
            if outcome == "stopped":
                return ExitCode.STOPPED
            self._tell(study, claim, outcome)
            crashes = crashes + 1 if outcome == "failed" else 0
            if crashes >= FAILURES_IN_A_ROW:
                self.say(f"slot {self.slot}: {crashes} trials in a row failed; stopping this "
                         f"worker (see the logs in {self.folder / LOGS})")
                return ExitCode.FAILED
        return ExitCode.STOPPED

    def command(self, claim: Claim) -> list[str]:
        s = self.search
        where = [f"output_dir={self.folder}", f"run_name={claim.run_name}", "resume=auto",
                 f"trial.study_dir={self.folder}", f"trial.number={claim.trial}"]
        chosen = [override(key, value) for key, value in claim.params.items()]
        return [*self.launch.prefix, *hpctrain_run(s.recipe, [*s.for_trials, *chosen, *where])]

    def _run_trial(self, claim: Claim) -> str | tuple:
        """'stopped', 'failed', or ('completed'|'pruned', summary)."""
        chosen = shown(claim.params)
        self.say(f"trial {claim.trial} {'resumed' if claim.resumed else 'started'} "
                 f"(slot {self.slot}): {chosen}")
        not_a_link(self.folder / claim.run_name)  # the trial's run stays in the search
        log_path = own_folder(self.folder / LOGS) / f"{claim.run_name}.log"
        heart = Heartbeat(claim_file(self.folder, self.slot), every=HEARTBEAT_SECONDS).start()
        try:
            with open_appending(log_path) as log:  # a resumed trial's log goes on
                self.child = subprocess.Popen(
                    self.command(claim), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env={**os.environ, **self.launch.environment,
                                                   **lifeline.environment()},
                    start_new_session=True)  # a terminal's Ctrl-C reaches the worker only
                if self.launch.cpus:  # before it imports torch: its threads inherit this
                    os.sched_setaffinity(self.child.pid, self.launch.cpus)
                code = self.child.wait()
        finally:
            heart.stop()
            self.child = None
        if code == ExitCode.STOPPED or (code != 0 and self.stopping.is_set()):
            self.say(f"trial {claim.trial}: stopped early (exit {code}); it continues where "
                     "it stopped when this search runs again")
            return "stopped"
        summary = RunDir(self.folder / claim.run_name).read_summary()
        status = (summary or {}).get("status")
        if code != 0 or status not in ("completed", "pruned"):
            self.say(f"trial {claim.trial} failed (exit {code}): {_last_line(log_path)} "
                     f"[log: {log_path}]")
            return "failed"
        return status, summary

    def _tell(self, study, claim: Claim, outcome) -> None:
        from optuna.trial import TrialState

        if outcome == "failed":
            tell(study, claim.trial, state=TrialState.FAIL)
            return
        status, summary = outcome
        if status == "pruned":
            tell(study, claim.trial, state=TrialState.PRUNED)
            self.say(f"trial {claim.trial} pruned at step {summary.get('steps')}")
            return
        value = summary.get(self.search.objective)
        if not isinstance(value, (int, float)) or value != value:
            self.say(f"trial {claim.trial}: its summary has no {self.search.objective} "
                     f"(it is {value!r}); marked failed")
            tell(study, claim.trial, state=TrialState.FAIL)
            return
        tell(study, claim.trial, float(value))
        best = study.best_trial
        self.say(f"trial {claim.trial} completed: {self.search.objective} {value:.4g} "
                 f"(best so far: trial {best.number}, {best.value:.4g})")


def _last_line(path: Path) -> str:
    lines = [line for line in tail_text(path).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("hpctrain: error:")]
    return (errors or lines or ["no output"])[-1][:300]
