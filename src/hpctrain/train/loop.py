"""The training loop: train, evaluate, checkpoint, stop in time.

Read it top to bottom: `train()` builds the parts (build.py) and hands them to `_run_steps`,
whose inner loop takes one training step (step.py: batch, device, forward, loss, backward,
update) and then, at intervals, reads back the figures (interval_figures.py), evaluates
(evaluation.py), checkpoints (run_record.py) and asks whether to stop (stops.py). The task
(tasks/) moves a batch to the device and says what the loss and the metrics are; the loop is
the same for every task. Inside the step nothing waits for the device: the loss and the
task's sums accumulate in device tensors (bookkeeping.py) and are read back, summed over all
ranks, once per logging interval. Across processes the only per-step collectives are the
gradient reduction (DDP/FSDP) and one tiny CPU-side stop flag (preemption.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import ExitStack

import torch

from hpctrain.cluster.environment import detect
from hpctrain.cluster.records import ProcessEnv
from hpctrain.config import Config
from hpctrain.data.user_datasets import forget_made
from hpctrain.data.worker_signals import start_resource_tracker
from hpctrain.errors import DataError, DataPipelineFailed, OutputError, Preempted, RunFailed
from hpctrain.monitor.beats import CLOSING, STARTUP, STEP
from hpctrain.monitor.hangs import HangWatch
from hpctrain.monitor.watchdog import Watchdog
from hpctrain.parallel import processes
from hpctrain.train import run_record, run_summary, stops
from hpctrain.train.bookkeeping import Clock, Interval, RunningMetrics
from hpctrain.train.build import Parts, build_parts
from hpctrain.train.checkpoints.progress_state import Progress
from hpctrain.train.checkpoints.resume import completed_summary, is_complete, restore
from hpctrain.train.checkpoints.run_place import set_aside
from hpctrain.train.interval_figures import micro_batch_figures, report_interval
from hpctrain.train.preemption import Stopper
from hpctrain.train.step import take_step
from hpctrain.train.telemetry import Telemetry
from hpctrain.train.trial import TrialPruned
from hpctrain.train.validation.evaluation import evaluate_and_record, owed_evaluation


def train(config: Config, env: ProcessEnv | None = None,
          on_step: Callable[[Parts, int], None] | None = None,
          started: float | None = None) -> dict | None:
    """Train `config` to the end (or resume it); the summary on rank 0, None elsewhere.
    Raises Preempted after a stop-and-save (signal or time limit). `on_step(parts, step)` is
    called at the end of every optimiser step (the profiler steps its schedule there).
    `started` (perf_counter): when this job began, for its time and device-hours; now when
    not given."""
    entered = time.perf_counter()  # the imports end here (the process began at `started`)
    started = entered if started is None else started
    env = env or detect()
    watch = HangWatch(config.monitor).start()  # a start-up that never ends is a hang too
    # From the very start: a notice during start-up is not lost, and the DataLoader workers,
    # forked later, inherit the harmless handler (Slurm signals every process of a step; a
    # worker killed by SIGUSR1 would crash the run).
    stopper = Stopper()
    held = ExitStack()  # the run directory's lock, from its claim to the run's end
    parts = None
    try:
        stopper.install(config.preemption.signal)  # a Ctrl-C held meanwhile: interrupted here
        start_resource_tracker((config.preemption.signal,))
        try:
            parts = build_parts(config, env, held, watch.beats)
        except RuntimeError as err:
            stops.raise_readable(err, env, "while starting", config)
        clock = Clock(started=started, marks={"entered": entered, "built": time.perf_counter()})
        watch.place(parts.run_dir, parts.distributed.env.rank, parts.world_size,
                    began=clock.began())
        stopper.attach(parts.distributed, parts.deadline)
        return _train(parts, stopper, on_step, clock, watch)
    finally:
        watch.stop()
        if parts is not None:  # the workers end with the run, however it ends
            parts.data.close()
        held.close()
        stopper.close()
        forget_made()  # a next run in this process makes your data again
        processes.leave()


def _train(parts: Parts, stopper: Stopper, on_step: Callable[[Parts, int], None] | None,
           clock: Clock, watch: HangWatch) -> dict | None:
    config, is_main = parts.config, parts.distributed.is_main
    parts.beats.beat(f"{STARTUP}: the resume")
    progress, changes = restore(parts, parts.resume_from) if parts.resume_from else \
        (Progress(), [])
    if parts.resume_from:
        clock.mark("resumed")
    if is_complete(progress, parts.total_steps):  # a finished run: touch nothing
        return _already_complete(parts, progress)
    parts.beats.beat(f"{STARTUP}: the run's records")
    moved = set_aside(parts.place) if is_main else None  # only once the resume succeeded
    lost = run_record.lost_start(parts)  # a job before that died without a word
    telemetry = Telemetry(parts.run_dir, parts.total_steps, progress.step, enabled=is_main,
                          saved_bytes=progress.metrics_bytes,
                          trained_to=lost["trained"] if lost else None)
    run_record.tell_start(parts, progress, telemetry, moved, changes)
    heartbeat = run_record.announce(parts, progress, clock, telemetry) if is_main else None
    watch.on_hang = functools.partial(stops.after_a_hang, parts, progress, clock)
    status, stopped, summary_problem = "failed", None, None
    parts.meter.start()
    try:
        _run_steps(parts, progress, clock, telemetry, stopper, on_step)
        status = "completed"
    except Preempted as stop:
        status, stopped = "preempted", stop
    except TrialPruned as pruned:  # every rank, together: a search's pruner stopped it
        status = "pruned"
        telemetry.message(f"hpctrain: {pruned}")
        run_record.finish_saving(parts)
    except torch.cuda.OutOfMemoryError:
        raise RunFailed(run_summary.oom_advice(parts, progress.step)) from None
    except DataPipelineFailed as failure:  # raised where a batch is fetched: between steps
        kept = stops.after_a_dead_worker(parts, progress, clock, telemetry)
        failure.args = (f"{failure}. {kept}",)
        raise
    except KeyboardInterrupt as interrupt:  # stops at once: said with what is kept
        status = "interrupted"
        interrupt.args = (stops.interrupted_at(progress, parts.total_steps),) if is_main else ()
        raise
    except RuntimeError as err:
        stops.raise_readable(err, parts.distributed.env, f"at step {progress.step}", config)
    finally:
        parts.beats.beat(CLOSING)
        telemetry.close()
        parts.meter.stop()
        if heartbeat is not None:
            heartbeat.stop()
        summary, summary_problem = run_record.close(parts, progress, clock, status, telemetry)
        if heartbeat is not None:
            heartbeat.close()
        run_record.record_end(parts, clock, progress.step)
    if summary_problem and stopped is None:
        raise OutputError(summary_problem)
    if stopped is not None:
        stops.requeue_and_raise(parts, stopped)
    return summary if is_main else None


def _already_complete(parts: Parts, progress: Progress) -> dict | None:
    """A run resumed at its end: said, and its summary as it was (rank 0; None elsewhere)."""
    if not parts.distributed.is_main:
        return None
    on = "Raise train.epochs or train.max_steps to train on." \
        if progress.stopped_early is None else \
        f"It stopped early {progress.stopped_early}; a new run trains without it."
    print(f"hpctrain: run {parts.run_dir} is already complete (step {progress.step} of "
          f"{parts.total_steps}); nothing to train, its summary.json is left as it was. {on}",
          flush=True)
    return completed_summary(parts, progress)


def _run_steps(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
               stopper: Stopper, on_step: Callable[[Parts, int], None] | None = None) -> None:
    cfg = parts.config.train
    eval_every, ckpt_every = _every(parts)
    metrics = RunningMetrics(parts.device, parts.task)
    figures = micro_batch_figures(parts, metrics)
    watchdog = Watchdog(parts.config.monitor.low_utilization, parts.config.monitor.low_intervals,
                        parts.config.name)
    _begin(parts, progress, clock, telemetry, stopper, metrics, eval_every)
    interval = Interval()  # after the start-up and an owed evaluation: each counted once
    opened = None  # the next epoch's batches, opened ahead as an epoch ends

    while progress.step < parts.total_steps and progress.stopped_early is None:
        epoch, batches = opened or _start_epoch(parts, progress.step, metrics)
        next_batch = functools.partial(_next_batch, batches)
        for _ in range(progress.step % parts.steps_per_epoch, parts.steps_per_epoch):
            parts.beats.beat(STEP, progress.step)
            interval.saving += parts.checkpointer.pending is not None  # a save writes meanwhile
            clock.data_wait_seconds += take_step(parts.step, next_batch, record=figures)
            _first_step_done(parts, clock)
            _after_step(parts, metrics)
            progress.step += 1
            interval.samples += parts.global_batch_size
            # ---- read back, evaluate, checkpoint: only at intervals ----
            last = progress.step == parts.total_steps
            if progress.step % cfg.log_every == 0 or last:
                report_interval(parts, progress, metrics, interval, clock, epoch, telemetry,
                                watchdog)
            paused = time.perf_counter()  # evaluation and checkpoints are not training time
            opened = None if last else _open_ahead(parts, progress.step, metrics)
            evaluates = parts.task.evaluates and (progress.step % eval_every == 0 or last)
            if evaluates:
                evaluate_and_record(parts, progress, clock, telemetry, stopper,
                                    -(-progress.step // eval_every))  # its number
            if progress.step % parts.steps_per_epoch == 0:
                _end_epoch(parts, progress, metrics, telemetry)
            if not last and parts.task.stop_asked is not None and parts.task.stop_asked():
                last = True  # a callback ends the run here (EarlyStopping), as completed
                _end_early(parts, progress, metrics, interval, clock, epoch, telemetry,
                           watchdog, stopper, evaluates)
            saved = _checkpoint_due(parts, progress.step, ckpt_every) or last
            if saved:
                run_record.save_checkpoint(parts, progress, clock, telemetry)
            parts.checkpointer.poll()
            # ---- stop in time: a signal or the deadline, agreed by all ranks ----
            # (after the last step only when it cut the final evaluation short)
            stop = None if last and progress.eval_owed is None else stopper.check()
            if stop is not None:
                if interval.samples:  # steps since the last read-back (none after the last)
                    interval.start += time.perf_counter() - paused
                    report_interval(parts, progress, metrics, interval, clock, epoch,
                                    telemetry, watchdog)
                stops.stop_saved(parts, progress, clock, telemetry, stopper, stop, saved)
            interval.start += time.perf_counter() - paused
            if on_step is not None:
                on_step(parts, progress.step)
            if last:
                break
    _moment(parts, metrics, "train_end")
    run_record.finish_saving(parts)


def _begin(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
           stopper: Stopper, metrics: RunningMetrics, eval_every: int) -> None:
    """Training begins: a stop asked during start-up honoured, the start-up's seconds
    counted (imports, build, resume), the task's train_start moment, and the evaluation a
    stop cut short done first."""
    parts.model.train()
    stops.stop_if_asked_during_start_up(stopper, progress)
    clock.startup_seconds = time.perf_counter() - clock.started
    clock.first_step = progress.step
    _moment(parts, metrics, "train_start")
    if progress.eval_owed is not None:
        owed_evaluation(parts, progress, clock, telemetry, stopper,
                        -(-progress.step // eval_every))


def _first_step_done(parts: Parts, clock: Clock) -> None:
    """When this job's first step ended (its compilation's, where compile is on), counted
    from the job's start: waited for once, as the step's kernels may still run."""
    if clock.first_step_seconds is not None:
        return
    if parts.device.type == "cuda":
        torch.cuda.synchronize(parts.device)
    clock.first_step_seconds = time.perf_counter() - clock.started


def _after_step(parts: Parts, metrics: RunningMetrics) -> None:
    """What the task's code logged after the step's figures were recorded (a
    LightningModule's on_before_optimizer_step, on_train_batch_end), into the interval."""
    logged = parts.task.after_step() if parts.task.after_step is not None else None
    if logged is not None:
        metrics.add_sums(logged)


def _moment(parts: Parts, metrics: RunningMetrics, moment: str) -> None:
    """The task's own code at one of the loop's moments (a LightningModule's hooks); what it
    logs joins the interval under way."""
    if parts.task.moment is not None:
        metrics.add_sums(parts.task.moment(moment, None))


def _end_early(parts: Parts, progress: Progress, metrics: RunningMetrics, interval: Interval,
               clock: Clock, epoch: int, telemetry: Telemetry, watchdog: Watchdog,
               stopper: Stopper, evaluated: bool) -> None:
    """The run ends at this step as asked: the interval under way reported, and the final
    weights evaluated where this step had no evaluation (the summary's figures are those
    of the weights it ends with); said, and kept in the checkpoint."""
    progress.stopped_early = f"at step {progress.step} of {parts.total_steps}: " + \
        parts.task.stop_asked()
    telemetry.message(f"hpctrain: stopped early {progress.stopped_early}")
    if interval.samples:
        report_interval(parts, progress, metrics, interval, clock, epoch, telemetry, watchdog)
    if parts.task.evaluates and not evaluated:
        eval_every, _ = _every(parts)
        evaluate_and_record(parts, progress, clock, telemetry, stopper,
                            -(-progress.step // eval_every))


def _end_epoch(parts: Parts, progress: Progress, metrics: RunningMetrics,
               telemetry: Telemetry) -> None:
    """The task's train_epoch_end moment, then the figures of the epoch just ended where the
    task reads any (what a LightningModule logged on_epoch): an `epoch` record at its last
    step, and a line."""
    _moment(parts, metrics, "train_epoch_end")
    figures = parts.task.epoch_figures() if parts.task.epoch_figures is not None else None
    if figures:
        epoch = progress.step // parts.steps_per_epoch - 1  # Lightning's current_epoch
        telemetry.record("epoch", progress.step, {"epoch": epoch, **figures})
        telemetry.message(f"epoch {epoch} ended: " + "  ".join(
            f"{name} {value:.4f}" for name, value in figures.items()))


def _checkpoint_due(parts: Parts, step: int, every: int) -> bool:
    """Whether `step` saves: checkpoint.every=auto's pacer (which then counts from it), or
    every `every` steps."""
    return step % every == 0 if parts.pacer is None else parts.pacer.saves(step)


def _every(parts: Parts) -> tuple[int, int]:
    """(steps between evaluations, steps between checkpoints)."""
    epoch = parts.steps_per_epoch
    train = parts.config.train
    return (train.eval_every_steps or max(1, round(train.eval_every_epochs * epoch)),
            parts.config.checkpoint.steps_between(epoch))


def _start_epoch(parts: Parts, step: int, metrics: RunningMetrics):
    """The task's train_epoch_start moment where an epoch begins (not at a resume within
    it), then the sampler pointed at this epoch (and, on resume, at the first unseen batch)."""
    epoch, step_in_epoch = divmod(step, parts.steps_per_epoch)
    if step_in_epoch == 0:
        _moment(parts, metrics, "train_epoch_start")
    size = parts.config.data.kind_spec.key_size(parts.config.data, epoch)
    parts.data.train_sampler.set_epoch(epoch, size,
                                       start=step_in_epoch * parts.global_batch_size)
    return epoch, iter(parts.data.train_loader)


def _open_ahead(parts: Parts, step: int, metrics: RunningMetrics):
    """At an epoch's end, the next epoch opened now, so that its workers render its first
    batches during the evaluation and the checkpoint between the two (the default recipe on
    an H200 waited 30-47 % of each epoch's first interval for them); None elsewhere, where
    the task's code runs at the epoch's start (a LightningModule's on_train_epoch_start may
    change the data it reads), and where each epoch starts workers of its own (a stream's:
    they would run beside the ending epoch's)."""
    if step % parts.steps_per_epoch or parts.task.moment is not None or \
            not getattr(parts.data.train_loader, "persistent_workers", False):
        return None
    return _start_epoch(parts, step, metrics)


def _next_batch(batches):
    try:
        return next(batches)
    except DataError as err:  # raised in a worker: keep the message, drop the worker traceback
        raise DataError(str(err).strip().splitlines()[-1].split("DataError: ", 1)[-1]) from None
