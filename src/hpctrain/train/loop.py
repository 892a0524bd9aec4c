"""The training loop: train, evaluate, checkpoint, stop in time.

Read it top to bottom: `train()` builds the parts (build.py) and hands them to `_run_steps`,
whose inner loop is the training step. The task (tasks.py: images or tokens) moves a batch to
the device and says what the loss and the metrics are; the loop is the same for every task.
Inside the step nothing waits for the device: the loss and the task's sums accumulate in device
tensors (bookkeeping.py) and are read back, summed over all ranks, once per logging interval.
Across processes the only per-step collectives are the gradient reduction (DDP/FSDP) and one
tiny CPU-side stop flag (preemption.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import NoReturn

import torch
from torch.distributed.tensor import DTensor

from hpctrain.cluster.environment import detect
from hpctrain.cluster.records import ProcessEnv
from hpctrain.cluster.scheduler import current as scheduler
from hpctrain.config import Config, to_yaml
from hpctrain.data.images.kind import image_size_for_epoch
from hpctrain.data.worker_signals import start_resource_tracker
from hpctrain.errors import (DataError, DataPipelineFailed, OutputError, Preempted, RunFailed,
                             cannot_write)
from hpctrain.monitor.meter import add_energy, energy_of, interval_record
from hpctrain.monitor.watchdog import Watchdog
from hpctrain.profiling.regions import region
from hpctrain.report import trackers
from hpctrain.report.page import write_run_report
from hpctrain.runs.directory import RunDir, remember_output_dir
from hpctrain.runs.identity import Heartbeat, earlier_jobs, record_job, record_start
from hpctrain.runs.live_registration import register
from hpctrain.tasks import tensors
from hpctrain.train import run_summary
from hpctrain.train.build import Parts, build_parts
from hpctrain.train.checkpoint import step_of
from hpctrain.train.evaluation import evaluate, keep_best
from hpctrain.train.bookkeeping import Clock, Interval, RunningMetrics
from hpctrain.parallel.processes import collective_failure
from hpctrain.train.preemption import Stopper
from hpctrain.train.progress_state import Progress
from hpctrain.train.resume import completed_summary, is_complete, restore, save
from hpctrain.train.run_place import set_aside
from hpctrain.train.telemetry import KEEP_GOING, Telemetry, write_summary
from hpctrain.train.trial import TrialPruned
from hpctrain.writers import write_whole


def train(config: Config, env: ProcessEnv | None = None,
          on_step: Callable[[Parts, int], None] | None = None,
          started: float | None = None) -> dict | None:
    """Train `config` to the end (or resume it); the summary on rank 0, None elsewhere.
    Raises Preempted after a stop-and-save (signal or time limit). `on_step(parts, step)` is
    called at the end of every optimiser step (the profiler steps its schedule there).
    `started` (perf_counter): when this job began, for its time and device-hours; now when
    not given."""
    started = time.perf_counter() if started is None else started
    env = env or detect()
    # From the very start: a notice during start-up is not lost, and the DataLoader workers,
    # forked later, inherit the harmless handler (Slurm signals every process of a step; a
    # worker killed by SIGUSR1 would crash the run).
    stopper = Stopper()
    held = ExitStack()  # the run directory's lock, from its claim to the run's end
    try:
        stopper.install(config.preemption.signal)  # a Ctrl-C held meanwhile: interrupted here
        start_resource_tracker((config.preemption.signal,))
        try:
            parts = build_parts(config, env, held)
        except RuntimeError as err:
            _raise_readable(err, env, "while starting", config)
        stopper.attach(parts.distributed, parts.deadline)
        return _train(parts, stopper, on_step, Clock(started=started))
    finally:
        held.close()
        stopper.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _raise_readable(err: RuntimeError, env: ProcessEnv, where: str, config: Config):
    """A lost or silent peer, said plainly; any other error unchanged."""
    failure = collective_failure(err, env, where, config.parallel.timeout_seconds)
    if failure is None:
        raise err
    raise failure from err


def _train(parts: Parts, stopper: Stopper, on_step: Callable[[Parts, int], None] | None,
           clock: Clock) -> dict | None:
    config, is_main = parts.config, parts.distributed.is_main
    progress, changes = restore(parts, parts.resume_from) if parts.resume_from else \
        (Progress(), [])
    if is_complete(progress, parts.total_steps):  # a finished run: touch nothing
        if is_main:
            print(f"hpctrain: run {parts.run_dir} is already complete (step {progress.step} of "
                  f"{parts.total_steps}); nothing to train, its summary.json is left as it "
                  "was. Raise train.epochs or train.max_steps to train on.", flush=True)
        return completed_summary(parts, progress) if is_main else None
    moved = set_aside(parts.place) if is_main else None  # only once the resume succeeded
    telemetry = Telemetry(parts.run_dir, parts.total_steps, progress.step, enabled=is_main,
                          saved_bytes=progress.metrics_bytes)
    _tell_start(parts, progress, telemetry, moved, changes)
    heartbeat = _announce(parts, progress, clock, telemetry) if is_main else None
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
        _finish_saving(parts)
    except torch.cuda.OutOfMemoryError:
        raise RunFailed(run_summary.oom_advice(parts, progress.step)) from None
    except DataPipelineFailed as failure:  # raised where a batch is fetched: between steps
        failure.args = (f"{failure}. {_after_a_dead_worker(parts, progress, clock, telemetry)}",)
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except RuntimeError as err:
        _raise_readable(err, parts.distributed.env, f"at step {progress.step}", config)
    finally:
        telemetry.close()
        parts.meter.stop()
        if heartbeat is not None:
            heartbeat.stop()
        run = run_summary.totals(parts, progress, clock)
        summary = run_summary.summary(parts, progress, clock, status, run)
        if is_main:
            _record_job(parts, clock, run)
            summary_problem = write_summary(parts.run_dir, summary)
            if config.report and (problem := write_run_report(parts.run_dir)):
                print(f"hpctrain: warning: {problem}", file=sys.stderr, flush=True)
            telemetry.finish(summary, _artifacts(parts.run_dir))
            heartbeat.close()
    if summary_problem and stopped is None:
        raise OutputError(summary_problem)
    if stopped is not None:
        _requeue_and_raise(parts, stopped)
    return summary if is_main else None


def _tell_start(parts: Parts, progress: Progress, telemetry: Telemetry, moved: str | None,
                changes: list[str]) -> None:
    """The banner, and what this start changed: checkpoints set aside, a stale lock taken
    over, settings changed since the checkpoint (also recorded in metrics.jsonl)."""
    telemetry.message(run_summary.banner(parts, parts.resume_from))
    if moved:
        telemetry.message(moved)
    if parts.place.lock.taken_over:
        telemetry.message(f"  took over {parts.place.lock.path}: {parts.place.lock.taken_over}")
    if changes:
        telemetry.message("  resuming with changed settings: " + "; ".join(changes)
                          + " (they apply from this step on)")
        telemetry.record("resume", progress.step, {"changes": changes})


def _requeue_and_raise(parts: Parts, stopped: Preempted) -> NoReturn:
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


def _after_a_dead_worker(parts: Parts, progress: Progress, clock: Clock,
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
    _save(parts, progress, clock, telemetry)
    _finish_saving(parts)
    return f"Saved {progress.last_good_checkpoint}; run the same command with resume=auto " \
        "to continue"


def _announce(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry) -> Heartbeat:
    """Rank 0 writes the run's configuration and its identity with this start (run.json, whose
    heartbeat then beats until the run ends), takes the earlier jobs' figures from there (every
    start counts, also one that saved nothing), opens its trackers, and registers it in a
    shared index when the environment names one (HPCTRAIN_DB)."""
    run = RunDir(parts.run_dir)
    identity = {}
    for path, write in ((run.config, lambda: write_whole(run.config, to_yaml(parts.config))),
                        (run.identity, lambda: identity.update(record_start(
                            parts.run_dir, parts.config.model_dump(mode="json"),
                            run_summary.start_record(parts), _lost_start(parts))))):
        try:
            write()
        except OSError as err:
            raise cannot_write(path, err, KEEP_GOING) from None
    clock.job_number = len(identity["starts"]) - 1
    for figure, value in earlier_jobs(identity, clock.job_number).items():
        setattr(progress, figure, value)
    telemetry.add_sinks(trackers.open_sinks(parts.config, parts.run_dir, identity))
    remember_output_dir(parts.run_dir.parent)
    return Heartbeat(run.identity, register(parts.distributed.env.runs_db,
                                            parts.run_dir)).start()


def _lost_start(parts: Parts) -> dict | None:
    """The start whose lock this one took over: it died without a word (run.json)."""
    gone = parts.place.lock.gone
    if gone is None:
        return None
    holder, beat = gone
    return {"claimed": holder.started, "job_id": holder.job_id, "restart": holder.restart,
            "host": holder.host, "last_beat": beat}


def _artifacts(run_dir) -> list:
    """What the trackers keep of the run besides its figures: the report and the profile."""
    run = RunDir(run_dir)
    return [p for p in (run.report, *run.report_pictures(), run.profile) if p.exists()]


def _run_steps(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
               stopper: Stopper, on_step: Callable[[Parts, int], None] | None = None) -> None:
    cfg = parts.config.train
    eval_every, ckpt_every = _every(parts)
    metrics = RunningMetrics(parts.device, parts.task)
    interval = Interval()
    watchdog = Watchdog(parts.config.monitor.low_utilization, parts.config.monitor.low_intervals,
                        parts.config.name)
    params = [p for p in parts.model.parameters() if p.requires_grad]
    parts.model.train()
    _stop_if_asked_during_start_up(stopper, progress)
    _moment(parts, metrics, "train_start")
    if progress.eval_owed is not None:
        _owed_evaluation(parts, progress, clock, telemetry, stopper, eval_every)

    while progress.step < parts.total_steps:
        if progress.step % parts.steps_per_epoch == 0:
            _moment(parts, metrics, "train_epoch_start")
        epoch, batches = _start_epoch(parts, progress.step)
        for _ in range(progress.step % parts.steps_per_epoch, parts.steps_per_epoch):
            _train_step(parts, batches, metrics, clock, params)
            progress.step += 1
            interval.samples += parts.global_batch_size
            # ---- read back, evaluate, checkpoint: only at intervals ----
            last = progress.step == parts.total_steps
            if progress.step % cfg.log_every == 0 or last:
                _log_interval(parts, progress, metrics, interval, clock, epoch, telemetry,
                              watchdog)
            paused = time.perf_counter()  # evaluation and checkpoints are not training time
            if progress.step % eval_every == 0 or last:
                _evaluate_and_record(parts, progress, clock, telemetry, stopper,
                                     -(-progress.step // eval_every))  # its number
            if progress.step % parts.steps_per_epoch == 0:
                _moment(parts, metrics, "train_epoch_end")
            saved = progress.step % ckpt_every == 0 or last
            if saved:
                _save(parts, progress, clock, telemetry)
            parts.checkpointer.poll()
            # ---- stop in time: a signal or the deadline, agreed by all ranks ----
            # (after the last step only when it cut the final evaluation short)
            stop = None if last and progress.eval_owed is None else stopper.check()
            if stop is not None:
                if interval.samples:  # steps since the last read-back (none after the last)
                    interval.start += time.perf_counter() - paused
                    _log_interval(parts, progress, metrics, interval, clock, epoch, telemetry,
                                  watchdog)
                _stop_saved(parts, progress, clock, telemetry, stopper, stop, saved)
            interval.start += time.perf_counter() - paused
            if on_step is not None:
                on_step(parts, progress.step)
            if last:
                break
    _moment(parts, metrics, "train_end")
    _finish_saving(parts)


def _moment(parts: Parts, metrics: RunningMetrics, moment: str) -> None:
    """The task's own code at one of the loop's moments (a LightningModule's hooks); what it
    logs joins the interval under way."""
    if parts.task.moment is not None:
        metrics.add_sums(parts.task.moment(moment))


def _every(parts: Parts) -> tuple[int, int]:
    """(steps between evaluations, steps between checkpoints)."""
    epoch = parts.steps_per_epoch
    ckpt = parts.config.checkpoint
    return (max(1, round(parts.config.train.eval_every_epochs * epoch)),
            ckpt.every_steps or max(1, round((ckpt.every_epochs or 1e9) * epoch)))


def _train_step(parts: Parts, batches, metrics: RunningMetrics, clock: Clock,
                params: list) -> None:
    """One optimiser step: gradients accumulated over train.grad_accum_steps micro-batches
    (under a pipeline, each runs the stages' schedule), then the update."""
    task, accumulate = parts.task, parts.config.train.grad_accum_steps
    for micro in range(accumulate):
        waited = time.perf_counter()
        with region("data_wait"):
            host_batch = _next_batch(batches)
        clock.data_wait_seconds += time.perf_counter() - waited
        with region("h2d_copy"):
            batch = task.to_device(host_batch, training=True)
        if parts.pipeline is not None:  # forward and backward over micro-batches
            with region("pipeline"), parts.loss_context():
                outputs, loss = parts.pipeline.train_step(batch, parts.precision)
            if outputs is None:
                continue  # not the last stage: the figures come from there
        else:
            with parts.gradient_sync(micro == accumulate - 1), parts.loss_context():
                with region("forward"), parts.precision.autocast():
                    outputs = tensors.call(parts.forward, batch.inputs)
                    loss = task.loss(outputs, batch)
                with region("backward"):
                    parts.precision.backward(loss / accumulate)
        with torch.no_grad(), parts.loss_context():
            sums = task.sums(outputs, batch, loss, True)
        if isinstance(loss, DTensor):  # from loss parallelism: the same on each rank
            loss = loss.full_tensor()
        metrics.add(loss.detach(), sums, batch.labels.shape[0])
    with region("optimizer"):
        parts.precision.step(parts.optimizer, params, parts.config.optim.grad_clip_norm)
        parts.scheduler.step()
        parts.optimizer.zero_grad(set_to_none=True)
        if parts.ema is not None:
            parts.ema.update()


def _stop_saved(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
                stopper: Stopper, stop: tuple[str, bool], saved: bool) -> NoReturn:
    """Every rank agreed to stop: save (unless this step just did), wait for the write, and
    raise Preempted with why and where."""
    if not saved:
        _save(parts, progress, clock, telemetry)
    _finish_saving(parts)
    clock.stop_seconds = stopper.seconds_since_signal()
    after = "" if clock.stop_seconds is None else f" {clock.stop_seconds:.1f} s after the signal"
    raise Preempted(f"stopped at step {progress.step} ({stop[0]}){_owed(progress)}; "
                    f"checkpoint {progress.last_good_checkpoint} saved{after}.", requeue=stop[1])


def _stop_if_asked_during_start_up(stopper: Stopper, progress: Progress) -> None:
    """A signal that came while the run was starting (data cache, model, process group) stops
    it before the first step, which may compile for minutes: nothing new to save."""
    stop = stopper.check()
    if stop is None:
        return
    where = (f"it resumes from {progress.last_good_checkpoint}" if
             progress.last_good_checkpoint else "nothing was trained or saved")
    raise Preempted(f"stopped during start-up, before step {progress.step + 1} ({stop[0]}); "
                    f"{where}.", requeue=stop[1])


def _owed_evaluation(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
                     stopper: Stopper, eval_every: int) -> None:
    """The scheduled evaluation that a stop cut short, at the step the run resumed from, done
    before training on; the checkpoint of that step is saved again with it (the same
    weights), so a later resume neither repeats nor skips it."""
    telemetry.message(f"step {progress.step}: the evaluation a stop cut short, done now")
    _evaluate_and_record(parts, progress, clock, telemetry, stopper,
                         -(-progress.step // eval_every))
    if progress.eval_owed is not None:
        stop = stopper.check() or ("a stop", True)
        raise Preempted(f"stopped at step {progress.step} ({stop[0]}){_owed(progress)}; "
                        f"checkpoint {progress.last_good_checkpoint} kept.", requeue=stop[1])
    _save(parts, progress, clock, telemetry)
    _finish_saving(parts)


def _owed(progress: Progress) -> str:
    """What a stop message adds when the stop cut the step's evaluation short."""
    return "" if progress.eval_owed is None else \
        " during its evaluation, which the resume does first"


def _save(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry) -> None:
    totals = run_summary.totals(parts, progress, clock)
    if not save(parts, progress, totals["job_seconds"], totals["job_energy_joules"]):
        telemetry.message(f"step {progress.step}: weights are not finite, checkpoint skipped")
    if parts.distributed.is_main:
        _record_job(parts, clock, totals)


def _record_job(parts: Parts, clock: Clock, totals: dict) -> None:
    """This job's figures so far into its start in run.json (rank 0, once announced)."""
    if clock.job_number is not None:
        seconds = totals["job_seconds"]
        record_job(parts.run_dir, clock.job_number, seconds,
                   seconds * parts.world_size / 3600, totals["job_energy_joules"])


def _finish_saving(parts: Parts) -> None:
    """Wait for an asynchronous save and let rank 0 publish it before anyone moves on."""
    parts.checkpointer.wait()
    parts.distributed.barrier()


def _start_epoch(parts: Parts, step: int):
    """Point the sampler at this epoch (and, on resume, at the first unseen batch)."""
    epoch, step_in_epoch = divmod(step, parts.steps_per_epoch)
    size = image_size_for_epoch(parts.config.data, epoch)  # images; tokens and points ignore it
    parts.data.train_sampler.set_epoch(epoch, size,
                                       start=step_in_epoch * parts.global_batch_size)
    return epoch, iter(parts.data.train_loader)


def _next_batch(batches):
    try:
        return next(batches)
    except DataError as err:  # raised in a worker: keep the message, drop the worker traceback
        raise DataError(str(err).strip().splitlines()[-1].split("DataError: ", 1)[-1]) from None


def _log_interval(parts: Parts, progress: Progress, metrics: RunningMetrics,
                  interval: Interval, clock: Clock, epoch: int, telemetry: Telemetry,
                  watchdog: Watchdog) -> None:
    """Read back the interval's figures (summed over ranks), check for NaN, report."""
    seconds = time.perf_counter() - interval.start
    waited = clock.data_wait_seconds - interval.wait_mark
    steps = interval.samples // parts.global_batch_size  # the last interval may be shorter
    per_rank = parts.distributed.gather([seconds, waited, *parts.meter.take()])
    clock.monitor_rows = [row[2:] for row in per_rank]
    values = metrics.read(parts.distributed)
    clock.train_seconds += seconds
    if not interval.first:
        clock.steady_seconds += seconds
        clock.steady_samples += interval.samples
        clock.steady_units += values["units"]
        totals = clock.rank_seconds or [0.0] * len(per_rank)
        clock.rank_seconds = [total + row[0] for total, row in zip(totals, per_rank)]
        clock.rank_steps += steps
    unit = parts.task.unit
    rates = {"samples_per_second": interval.samples / seconds,
             f"{unit}_per_second": values["units"] / seconds}
    data_wait = waited / seconds
    interval.start, interval.samples, interval.first = time.perf_counter(), 0, False
    interval.wait_mark = clock.data_wait_seconds
    if "padding_fraction" in values:
        clock.padding_fraction = values["padding_fraction"]

    lr = parts.optimizer.param_groups[0]["lr"]
    if values.pop("all_nonfinite"):
        progress.nan_intervals += 1
        if progress.nan_since_step is None:
            progress.nan_since_step = max(0, progress.step - steps) + 1
        if progress.nan_intervals >= parts.config.train.nan_patience:
            raise RunFailed(
                f"the loss has been NaN/inf at every step since step {progress.nan_since_step} "
                f"(stopped at step {progress.step}). Last good checkpoint: "
                f"{progress.last_good_checkpoint or 'none saved yet'}. Try a lower optim.lr "
                f"(now {lr:.3g}), optim.grad_clip_norm=1.0, a longer schedule.warmup_epochs, "
                "or precision=bf16 instead of fp16.")
    else:
        progress.nan_intervals, progress.nan_since_step = 0, None
    spec = parts.config.task_spec
    record = {"loss": values["loss"], "lr": lr, "epoch": progress.step / parts.steps_per_epoch,
              **rates, "data_wait_fraction": data_wait,
              **{spec.figure_name("train", name): value  # the task's own
                 for name, value in values.items()
                 if name not in ("loss", "units", "padding_fraction")}}
    if "padding_fraction" in values:
        record["padding_fraction"] = values["padding_fraction"]
    if len(per_rank) > 1:
        record["rank_step_seconds"] = [r[0] / steps for r in per_rank]
        record["rank_data_wait_fraction"] = [r[1] / r[0] if r[0] else 0.0 for r in per_rank]
    telemetry.record("train", progress.step, record)
    _record_gpus(parts, progress, clock, telemetry, watchdog, per_rank, steps, data_wait)
    label = parts.config.task_spec.rate_label
    telemetry.show(progress.step, f"epoch {epoch}  loss {values['loss']:.4f}  "
                                  f"{rates[unit + '_per_second']:,.0f} {label}/s  "
                                  f"data wait {data_wait:.0%}")


def _record_gpus(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
                 watchdog: Watchdog, per_rank: list, steps: int, data_wait: float) -> None:
    """The interval's `gpu` record (per rank: the sampler's figures, step time, data wait),
    and the watchdog's line when the GPUs have idled for too long."""
    gpus = interval_record(clock.monitor_rows)
    if gpus is None:
        return
    gpus["step_seconds"] = [row[0] / max(steps, 1) for row in per_rank]
    gpus["data_wait_fraction"] = [row[1] / row[0] if row[0] else 0.0 for row in per_rank]
    gpus["energy_joules"] = add_energy(progress.energy_joules, energy_of(clock.monitor_rows))
    telemetry.record("gpu", progress.step, gpus)
    warning = watchdog.observe(gpus["utilization_mean"], data_wait)
    if warning:
        telemetry.message(warning)


def _evaluate_and_record(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
                         stopper: Stopper, evaluation: int) -> None:
    """Evaluate (the `evaluation`-th time), record it, and report it to the search when the
    run is one of its trials: TrialPruned when the study stops it. An evaluation a stop cuts
    short is owed (progress.eval_owed, checkpointed): the resume does it first."""
    start = time.perf_counter()
    model = parts.fused_eval.module() if parts.fused_eval else parts.forward
    progress.eval_owed = progress.step  # until recorded: a stop or a failure leaves it owed
    values = evaluate(parts, model, stopper)
    seconds = time.perf_counter() - start  # the sums' read-back waited for the device
    if values is None:
        telemetry.message(f"step {progress.step}: evaluation cut short to stop in time")
        return
    progress.eval_owed = None
    keep_best(progress, values)
    if parts.ema is not None:
        values.update({f"{k}_ema": v for k, v in evaluate(parts, parts.ema.module).items()})
    run = run_summary.totals(parts, progress, clock)  # where a leaderboard reads time to target
    telemetry.record("eval", progress.step, {
        **values, "epoch": progress.step / parts.steps_per_epoch, "eval_seconds": seconds,
        **{key: run[key] for key in ("elapsed_seconds", "device_hours", "energy_joules")}})
    telemetry.message(f"step {progress.step}: " + "  ".join(  # None: undefined (R² of one value)
        f"{name} {'-' if value is None else f'{value:.4f}'}" for name, value in values.items()))
    if parts.trial is not None and parts.trial.prune(values, evaluation,
                                                     progress.step == parts.total_steps):
        raise TrialPruned(f"trial {parts.trial.number} pruned by the study after evaluation "
                          f"{evaluation} (step {progress.step})")
