"""How a run stops short of its end and what it keeps: a stop agreed by all ranks (a signal or
the deadline) saves and may requeue the job; a signal during start-up stops before the first
step; a dead loader worker keeps or saves the last whole step; a hang (monitor/hangs.py) keeps
the last checkpoint and requeues the job, up to monitor.hang_requeues times a run; a lost or
silent peer is said plainly."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from hpctrain.cluster.records import ProcessEnv
from hpctrain.cluster.scheduler import current as scheduler
from hpctrain.config import Config
from hpctrain.errors import ExitCode, Preempted
from hpctrain.monitor.hangs import Hang
from hpctrain.parallel.processes import collective_failure
from hpctrain.train.bookkeeping import Clock
from hpctrain.train.build import Parts
from hpctrain.train.checkpoints.checkpoint import step_of
from hpctrain.train.checkpoints.progress_state import Progress
from hpctrain.train.preemption import Stopper
from hpctrain.train.run_record import finish_saving, record_hang, save_checkpoint
from hpctrain.train.telemetry import Telemetry
from hpctrain.train.validation.evaluation import owed


def raise_readable(err: RuntimeError, env: ProcessEnv, where: str, config: Config) -> NoReturn:
    """A lost or silent peer, said plainly; any other error unchanged."""
    failure = collective_failure(err, env, where, config.parallel.timeout_seconds)
    if failure is None:
        raise err
    raise failure from err


def stop_if_asked_during_start_up(stopper: Stopper, progress: Progress) -> None:
    """A signal that came while the run was starting (data cache, model, process group) stops
    it before the first step, which may compile for minutes: nothing new to save."""
    stop = stopper.check()
    if stop is None:
        return
    where = (f"it resumes from {progress.last_good_checkpoint}" if
             progress.last_good_checkpoint else "nothing was trained or saved")
    raise Preempted(f"stopped during start-up, before step {progress.step + 1} ({stop[0]}); "
                    f"{where}.", requeue=stop[1])


def interrupted_at(progress: Progress, total_steps: int) -> str:
    """Where a Ctrl-C stopped the run, and what it keeps: a Ctrl-C stops at once (a second
    would break off a save), so nothing new is saved."""
    kept = (f"checkpoint {progress.last_good_checkpoint} is kept: the same command with "
            "resume=auto continues from it" if progress.last_good_checkpoint else
            "no checkpoint had been saved yet: the same command starts it over")
    return f"at step {progress.step} of {total_steps} (Ctrl-C stops at once; {kept})"


def stop_saved(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
               stopper: Stopper, stop: tuple[str, bool], saved: bool) -> NoReturn:
    """Every rank agreed to stop: save (unless this step just did), wait for the write, and
    raise Preempted with why and where."""
    if not saved:
        save_checkpoint(parts, progress, clock, telemetry)
    finish_saving(parts)
    clock.stop_seconds = stopper.seconds_since_signal()
    after = "" if clock.stop_seconds is None else f" {clock.stop_seconds:.1f} s after the signal"
    raise Preempted(f"stopped at step {progress.step} ({stop[0]}){owed(progress)}; "
                    f"checkpoint {progress.last_good_checkpoint} saved{after}.", requeue=stop[1])


def requeue_and_raise(parts: Parts, stopped: Preempted) -> NoReturn:
    """After a stop and save: under Slurm, rank 0 asks for the requeue the stop wants (up to
    preemption.max_requeues); then the stop goes up to the CLI, which says it and exits."""
    env, preemption = parts.distributed.env, parts.config.preemption
    if parts.distributed.is_main and env.job_id and stopped.requeue and \
            preemption.requeue == "auto":
        if env.restart_count < preemption.max_requeues:
            stopped.args = (f"{stopped} {scheduler().requeue(env.job_id, env.script_continues)}",)
        else:
            stopped.args = (f"{stopped} Not requeued: the job has been restarted "
                            f"{env.restart_count} times (preemption.max_requeues).",)
    stopped.quiet = not parts.distributed.is_main
    raise stopped


def after_a_dead_worker(parts: Parts, progress: Progress, clock: Clock,
                        telemetry: Telemetry) -> str:
    """What is kept after a loader worker died (found where a batch is fetched: between
    steps). The weights and optimiser are the last whole step's, which one process saves (an
    evaluation under way owed). Several processes cannot: the others wait in a collective of
    the step the dead worker's rank never began; the last checkpoint stands."""
    kept = progress.last_good_checkpoint
    saved_now = kept and step_of(Path(kept)) == progress.step and progress.eval_owed is None
    if parts.world_size > 1 or progress.step == 0 or saved_now:
        return (f"The last checkpoint, {kept}, is kept" if kept else "No checkpoint was "
                "saved yet") + "; run the same command with resume=auto to continue"
    save_checkpoint(parts, progress, clock, telemetry)
    finish_saving(parts)
    return f"Saved {progress.last_good_checkpoint}; run the same command with resume=auto " \
        "to continue"


def after_a_hang(parts: Parts, progress: Progress, clock: Clock, hang: Hang) -> int:
    """From the hang watch, on each rank: the exit code of a hung job. Rank 0 records the hang
    (run.json, summary.json), says what is kept, and asks for the requeue a stop would (in a
    scheduler's job, up to preemption.max_requeues restarts); past monitor.hang_requeues
    hangs in the run it asks for none and ends the job as failed."""
    if not parts.distributed.is_main:
        return ExitCode.HUNG
    clock.hung_seconds = hang.silent
    hangs = record_hang(parts, progress, clock, hang.line)
    kept = (f"checkpoint {progress.last_good_checkpoint} is kept" if
            progress.last_good_checkpoint else "no checkpoint was saved yet")
    limit = parts.config.monitor.hang_requeues
    if hangs > limit:
        print(f"hpctrain: the run hung {hangs} times (monitor.hang_requeues={limit}): not "
              f"requeued; {kept}. The stacks are in {parts.run_dir}/hang/.", file=sys.stderr,
              flush=True)
        return ExitCode.FAILED
    env, preemption = parts.distributed.env, parts.config.preemption
    then = ""
    if env.job_id and preemption.requeue == "auto":
        then = " " + (scheduler().requeue(env.job_id, env.script_continues)
                      if env.restart_count < preemption.max_requeues else
                      f"Not requeued: the job has been restarted {env.restart_count} times "
                      "(preemption.max_requeues).")
    print(f"hpctrain: {kept}; the stacks are in {parts.run_dir}/hang/.{then} Run the same "
          f"command again (resume=auto) to continue; exit status {int(ExitCode.HUNG)} means "
          "'hung, requeue me'.", file=sys.stderr, flush=True)
    return ExitCode.HUNG
