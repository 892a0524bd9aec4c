"""The training loop: train, evaluate, checkpoint, stop in time.

Read it top to bottom: `train()` builds the parts (build.py) and hands them to `_run_steps`,
whose inner loop is the training step. Inside the step nothing waits for the device: loss and
accuracy accumulate in device tensors (`RunningMetrics`) and are read back, summed over all
ranks, once per logging interval. Across processes the only per-step collectives are the
gradient reduction (DDP/FSDP) and one tiny CPU-side stop flag (preemption.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from hpctrain.cluster.environment import ProcessEnv, detect
from hpctrain.cluster.job import requeue
from hpctrain.config import Config, to_yaml
from hpctrain.data.loader import image_size_for_epoch
from hpctrain.errors import DataError, OutputError, Preempted, RunFailed, cannot_write
from hpctrain.profiling.regions import region
from hpctrain.train import report
from hpctrain.train.build import Parts, build_parts
from hpctrain.train.parallel import collective_failure
from hpctrain.train.preemption import Stopper
from hpctrain.train.resume import Progress, completed_summary, restore, save
from hpctrain.train.run_dir import set_aside
from hpctrain.train.telemetry import KEEP_GOING, Telemetry, write_summary


@dataclass
class Clock:
    """Training time (evaluation and checkpointing excluded) and time spent waiting for data."""

    started: float = field(default_factory=time.perf_counter)
    train_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    steady_seconds: float = 0.0  # after the first logging interval (warm-up, compilation)
    steady_images: int = 0
    rank_seconds: list[float] = field(default_factory=list)  # steady time per rank (rank 0)
    rank_steps: int = 0
    stop_seconds: float | None = None  # from a stop signal to its checkpoint, when one came


@dataclass
class Interval:
    """The logging interval under way: when it started, what it trained, how long it waited."""

    start: float = field(default_factory=time.perf_counter)
    images: int = 0
    wait_mark: float = 0.0  # clock.data_wait_seconds at the start
    first: bool = True  # the first interval holds warm-up (and compilation): not steady


class RunningMetrics:
    """Loss and accuracy sums kept on the device; `read()` is the only synchronisation."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(3, device=self.device)  # loss, correct, non-finite count
        self.samples = 0
        self.micro_steps = 0

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        finite = torch.isfinite(loss)
        correct = (logits.argmax(dim=1) == labels).sum()
        self.sums += torch.stack([torch.where(finite, loss, 0.0), correct, ~finite])
        self.samples += labels.shape[0]
        self.micro_steps += 1

    def read(self, distributed) -> dict:
        """Sums over all ranks since the last read, then reset."""
        counts = torch.tensor([self.samples, self.micro_steps], device=self.device)
        totals = distributed.sum_(torch.cat([self.sums, counts.to(self.sums.dtype)]))
        loss_sum, correct, nonfinite, samples, micro_steps = totals.tolist()
        finite_steps = micro_steps - nonfinite
        values = {
            "loss": loss_sum / finite_steps if finite_steps else math.nan,
            "accuracy": correct / max(samples, 1),
            "all_nonfinite": nonfinite == micro_steps and micro_steps > 0,
        }
        self.reset()
        return values


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
    stopper.install(config.preemption.signal)
    try:
        try:
            parts = build_parts(config, env)
        except RuntimeError as err:
            _raise_readable(err, env, "while starting", config)
        stopper.attach(parts.distributed, parts.deadline)
        return _train(parts, stopper, on_step, Clock(started=started))
    finally:
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
    if progress.step >= parts.total_steps:  # a finished run: touch nothing
        if is_main:
            print(f"hpctrain: run {parts.run_dir} is already complete (step {progress.step} of "
                  f"{parts.total_steps}); nothing to train, its summary.json is left as it "
                  "was. Raise train.epochs or train.max_steps to train on.", flush=True)
        return completed_summary(parts, progress) if is_main else None
    moved = set_aside(parts.place) if is_main else None  # only once the resume succeeded
    telemetry = Telemetry(parts.run_dir, parts.total_steps, progress.step, config.tensorboard,
                          enabled=is_main)
    telemetry.message(report.banner(parts, parts.resume_from))
    if moved:
        telemetry.message(moved)
    if changes:
        telemetry.message("  resuming with changed settings: " + "; ".join(changes)
                          + " (they apply from this step on)")
        telemetry.record("resume", progress.step, {"changes": changes})
    if is_main:
        try:
            (parts.run_dir / "config.yaml").write_text(to_yaml(config))
        except OSError as err:
            raise cannot_write(parts.run_dir / "config.yaml", err, KEEP_GOING) from None
    status, stopped, summary_problem = "failed", None, None
    try:
        _run_steps(parts, progress, clock, telemetry, stopper, on_step)
        status = "completed"
    except Preempted as stop:
        status, stopped = "preempted", stop
    except torch.cuda.OutOfMemoryError:
        raise RunFailed(report.oom_advice(parts, progress.step)) from None
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except RuntimeError as err:
        _raise_readable(err, parts.distributed.env, f"at step {progress.step}", config)
    finally:
        telemetry.close()
        summary = report.summary(parts, progress, clock, status)
        if is_main:
            summary_problem = write_summary(parts.run_dir, summary)
    if summary_problem and stopped is None:
        raise OutputError(summary_problem)
    if stopped is not None:
        env = parts.distributed.env
        if is_main and env.job_id and stopped.requeue and config.preemption.requeue == "auto":
            if env.restart_count < config.preemption.max_requeues:
                stopped.args = (f"{stopped} {requeue(env.job_id, env.script_continues)}",)
            else:
                stopped.args = (f"{stopped} Not requeued: the job has been restarted "
                                f"{env.restart_count} times (preemption.max_requeues).",)
        stopped.quiet = not is_main
        raise stopped
    return summary if is_main else None


def _run_steps(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry,
               stopper: Stopper, on_step: Callable[[Parts, int], None] | None = None) -> None:
    cfg = parts.config.train
    eval_every = max(1, round(cfg.eval_every_epochs * parts.steps_per_epoch))
    ckpt_cfg = parts.config.checkpoint
    ckpt_every = ckpt_cfg.every_steps or max(1, round((ckpt_cfg.every_epochs or 1e9)
                                                      * parts.steps_per_epoch))
    metrics = RunningMetrics(parts.device)
    interval = Interval()
    params = [p for p in parts.model.parameters() if p.requires_grad]
    parts.model.train()
    _stop_if_asked_during_start_up(stopper, progress)

    while progress.step < parts.total_steps:
        epoch, batches = _start_epoch(parts, progress.step)
        for _ in range(progress.step % parts.steps_per_epoch, parts.steps_per_epoch):
            # ---- the training step: accumulate gradients over micro-batches, then step ----
            for micro in range(cfg.grad_accum_steps):
                waited = time.perf_counter()
                with region("data_wait"):
                    images, labels = _next_batch(batches)
                clock.data_wait_seconds += time.perf_counter() - waited
                with region("h2d_copy"):
                    images, labels = parts.batcher(images, labels)
                    targets = labels
                    if parts.mixing is not None:
                        images, targets = parts.mixing(images, labels)
                with parts.gradient_sync(micro == cfg.grad_accum_steps - 1):
                    with region("forward"), parts.precision.autocast():
                        logits = parts.forward(images)
                        loss = parts.criterion(logits, targets)
                    with region("backward"):
                        parts.precision.backward(loss / cfg.grad_accum_steps)
                metrics.add(loss.detach(), logits.detach(), labels)
            with region("optimizer"):
                parts.precision.step(parts.optimizer, params, parts.config.optim.grad_clip_norm)
                parts.scheduler.step()
                parts.optimizer.zero_grad(set_to_none=True)
                if parts.ema is not None:
                    parts.ema.update()
            progress.step += 1
            interval.images += parts.global_batch_size
            # ---- read back, evaluate, checkpoint: only at intervals ----
            last = progress.step == parts.total_steps
            if progress.step % cfg.log_every == 0 or last:
                _log_interval(parts, progress, metrics, interval, clock, epoch, telemetry)
            paused = time.perf_counter()  # evaluation and checkpoints are not training time
            if progress.step % eval_every == 0 or last:
                _evaluate_and_record(parts, progress, telemetry, stopper)
            saved = progress.step % ckpt_every == 0 or last
            if saved:
                _save(parts, progress, clock, telemetry)
            parts.checkpointer.poll()
            # ---- stop in time: a signal or the deadline, agreed by all ranks ----
            stop = None if last else stopper.check()
            if stop is not None:
                if progress.step % cfg.log_every:  # the steps since the last read-back
                    interval.start += time.perf_counter() - paused
                    _log_interval(parts, progress, metrics, interval, clock, epoch, telemetry)
                if not saved:
                    _save(parts, progress, clock, telemetry)
                _finish_saving(parts)
                clock.stop_seconds = stopper.seconds_since_signal()
                after = "" if clock.stop_seconds is None else \
                    f" {clock.stop_seconds:.1f} s after the signal"
                raise Preempted(f"stopped at step {progress.step} ({stop[0]}); checkpoint "
                                f"{progress.last_good_checkpoint} saved{after}.",
                                requeue=stop[1])
            interval.start += time.perf_counter() - paused
            if on_step is not None:
                on_step(parts, progress.step)
            if last:
                break
    _finish_saving(parts)


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


def _save(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry) -> None:
    if not save(parts, progress, time.perf_counter() - clock.started):
        telemetry.message(f"step {progress.step}: weights are not finite, checkpoint skipped")


def _finish_saving(parts: Parts) -> None:
    """Wait for an asynchronous save and let rank 0 publish it before anyone moves on."""
    parts.checkpointer.wait()
    parts.distributed.barrier()


def _start_epoch(parts: Parts, step: int):
    """Point the sampler at this epoch (and, on resume, at the first unseen batch)."""
    epoch, step_in_epoch = divmod(step, parts.steps_per_epoch)
    size = image_size_for_epoch(parts.config.data, epoch)
    parts.data.train_sampler.set_epoch(epoch, size,
                                       start=step_in_epoch * parts.global_batch_size)
    return epoch, iter(parts.data.train_loader)


def _next_batch(batches):
    try:
        return next(batches)
    except DataError as err:  # raised in a worker: keep the message, drop the worker traceback
        raise DataError(str(err).strip().splitlines()[-1].split("DataError: ", 1)[-1]) from None


def _log_interval(parts: Parts, progress: Progress, metrics: RunningMetrics,
                  interval: Interval, clock: Clock, epoch: int, telemetry: Telemetry) -> None:
    """Read back the interval's figures (summed over ranks), check for NaN, report."""
    seconds = time.perf_counter() - interval.start
    waited = clock.data_wait_seconds - interval.wait_mark
    steps = interval.images // parts.global_batch_size  # the last interval may be shorter
    per_rank = parts.distributed.gather([seconds, waited])
    clock.train_seconds += seconds
    if not interval.first:
        clock.steady_seconds += seconds
        clock.steady_images += interval.images
        totals = clock.rank_seconds or [0.0] * len(per_rank)
        clock.rank_seconds = [total + mine for total, (mine, _) in zip(totals, per_rank)]
        clock.rank_steps += steps
    values = metrics.read(parts.distributed)
    images_per_second = interval.images / seconds
    data_wait = waited / seconds
    interval.start, interval.images, interval.first = time.perf_counter(), 0, False
    interval.wait_mark = clock.data_wait_seconds

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
    record = {"loss": values["loss"], "train_accuracy": values["accuracy"], "lr": lr,
              "epoch": progress.step / parts.steps_per_epoch, "images_per_second":
              images_per_second, "data_wait_fraction": data_wait}
    if len(per_rank) > 1:
        record["rank_step_seconds"] = [r[0] / steps for r in per_rank]
        record["rank_data_wait_fraction"] = [r[1] / r[0] if r[0] else 0.0 for r in per_rank]
    telemetry.record("train", progress.step, record)
    telemetry.show(progress.step, f"epoch {epoch}  loss {values['loss']:.4f}  "
                                  f"{images_per_second:,.0f} img/s  data wait {data_wait:.0%}")


@torch.no_grad()
def evaluate(parts: Parts, model: nn.Module, stopper: Stopper | None = None) -> float | None:
    """Top-1 accuracy on the validation set, every sample counted once over all ranks; None
    when a stop (signal or deadline) was agreed on midway: a long evaluation must not eat the
    grace time before Slurm's SIGKILL.

    Every rank runs the same number of batches (the sampler pads with repeats, which FSDP's
    collectives need); the repeats at the end of a rank's share are left out of the count."""
    model.eval()
    counts = torch.zeros(2, device=parts.device, dtype=torch.long)  # correct, total
    real = parts.data.val_sampler.real_count
    seen = 0
    try:
        for images, labels in parts.data.val_loader:
            if stopper is not None and stopper.check() is not None:
                return None
            keep = max(0, min(labels.shape[0], real - seen))
            seen += labels.shape[0]
            images, labels = parts.batcher(images, labels)
            with parts.precision.autocast():
                logits = model(images)
            counts[0] += (logits[:keep].argmax(dim=1) == labels[:keep]).sum()
            counts[1] += keep
    finally:
        model.train()
    correct, total = parts.distributed.sum_(counts).tolist()
    return correct / max(total, 1)


def _evaluate_and_record(parts: Parts, progress: Progress, telemetry: Telemetry,
                         stopper: Stopper | None = None) -> None:
    accuracy = evaluate(parts, parts.forward, stopper)
    if accuracy is None:
        telemetry.message(f"step {progress.step}: evaluation cut short to stop in time")
        return
    progress.final_val_accuracy = accuracy
    progress.best_val_accuracy = max(accuracy, progress.best_val_accuracy or 0.0)
    values = {"val_accuracy": accuracy, "epoch": progress.step / parts.steps_per_epoch}
    if parts.ema is not None:
        values["val_accuracy_ema"] = evaluate(parts, parts.ema.module)
    telemetry.record("eval", progress.step, values)
    telemetry.message(f"step {progress.step}: val_accuracy {accuracy:.4f}"
                      + (f"  (EMA {values['val_accuracy_ema']:.4f})" if parts.ema else ""))
