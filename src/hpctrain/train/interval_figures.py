"""The figures of a logging interval: each micro-batch's loss and task sums added on the
device as the step runs, then, once per interval, read back summed over all ranks, checked for
a loss that stays NaN, and reported (metrics.jsonl, the console, the trackers) with the GPUs'
figures and the idle-GPU watchdog's word."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor

from hpctrain.errors import RunFailed
from hpctrain.monitor.meter import add_energy, energy_of, interval_record
from hpctrain.monitor.watchdog import Watchdog
from hpctrain.tasks.steps import Batch
from hpctrain.train import compilation
from hpctrain.train.bookkeeping import Clock, Interval, RunningMetrics
from hpctrain.train.build import Parts
from hpctrain.train.checkpoints.progress_state import Progress
from hpctrain.train.telemetry import Telemetry


def micro_batch_figures(parts: Parts, metrics: RunningMetrics) -> Callable:
    """What the step calls with each micro-batch's (outputs, batch, loss): the task's sums
    and the loss added to the interval's, on the device, nothing read back."""
    def add(outputs, batch: Batch, loss: torch.Tensor) -> None:
        with torch.no_grad(), parts.step.loss_context():
            sums = parts.task.sums(outputs, batch, loss, True)
        if isinstance(loss, DTensor):  # from loss parallelism: the same on each rank
            loss = loss.full_tensor()
        metrics.add(loss.detach(), sums, batch.labels.shape[0])
    return add


def report_interval(parts: Parts, progress: Progress, metrics: RunningMetrics,
                    interval: Interval, clock: Clock, epoch: int, telemetry: Telemetry,
                    watchdog: Watchdog) -> None:
    """Read back the interval's figures (summed over ranks), check for NaN, report."""
    seconds = time.perf_counter() - interval.start
    waited = clock.data_wait_seconds - interval.wait_mark
    steps = interval.samples // parts.global_batch_size  # the last interval may be shorter
    per_rank = parts.distributed.gather([seconds, waited, clock.last_save_seconds,
                                         *parts.meter.take()])
    clock.monitor_rows = [row[3:] for row in per_rank]
    if parts.pacer is not None and steps:  # every rank alike, from every rank's figures
        parts.pacer.update(max(row[0] for row in per_rank) / steps,
                           max(row[2] for row in per_rank) or None)
    clock.last_save_seconds = 0.0
    values = metrics.read(parts.distributed)
    clock.train_seconds += seconds
    if not interval.first:  # warm-up (and compilation) is no measure of a step
        clock.count_save_dip(seconds, waited, steps, interval.saving)
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
    if values.get("padding_fraction") is not None:
        clock.add_padding(values["padding_fraction"], interval.samples)
    interval.start, interval.samples, interval.first = time.perf_counter(), 0, False
    interval.saving = 0
    interval.wait_mark = clock.data_wait_seconds

    lr = parts.step.optimizer.param_groups[0]["lr"]
    _stop_if_nan_too_long(parts, progress, values.pop("all_nonfinite"), steps, lr)
    spec = parts.config.task_spec
    record = {"loss": values["loss"], "lr": lr, "epoch": progress.step / parts.steps_per_epoch,
              **rates, "seconds_per_step": seconds / steps if steps else None,
              "data_wait_fraction": data_wait,
              **{spec.figure_name("train", name): value  # the task's own
                 for name, value in values.items()
                 if name not in ("loss", "units", "padding_fraction")}}
    if values.get("padding_fraction") is not None:
        record["padding_fraction"] = values["padding_fraction"]
    if len(per_rank) > 1:
        record["rank_step_seconds"] = [r[0] / steps for r in per_rank]
        record["rank_data_wait_fraction"] = [r[1] / r[0] if r[0] else 0.0 for r in per_rank]
    telemetry.record("train", progress.step, record)
    if parts.plan.compile:
        _tell_compiling(clock, telemetry)
    _record_gpus(parts, progress, clock, telemetry, watchdog, per_rank, steps, data_wait)
    label = spec.rate_label
    telemetry.show(progress.step, f"epoch {epoch}  loss {values['loss']:.4f}  "
                                  f"{rates[unit + '_per_second']:,.0f} {label}/s  "
                                  f"data wait {data_wait:.0%}")


def _tell_compiling(clock: Clock, telemetry: Telemetry) -> None:
    """Once a job each: a compiled model torch keeps compiling again (batches of ever new
    shapes), with why and the fix; graphs torch ran without the CUDA graphs asked for, with
    its reason."""
    if clock.recompiling_told and clock.graph_skips_told:
        return
    compiled = clock.compiled()
    if not clock.recompiling_told and compiled["recompiles"] >= compilation.RECOMPILES_TOLD:
        clock.recompiling_told = True
        telemetry.message(compilation.recompiling(int(compiled["recompiles"]),
                                                  compilation.recompile_reasons()))
    if not clock.graph_skips_told and compiled["cuda_graph_skips"]:
        clock.graph_skips_told = True
        telemetry.message(compilation.graphs_skipped(int(compiled["cuda_graph_skips"]),
                                                     compilation.graph_skip_reasons()))


def _stop_if_nan_too_long(parts: Parts, progress: Progress, all_nonfinite: bool, steps: int,
                          lr: float) -> None:
    """The NaN policy: an interval whose every step's loss was NaN or inf counts; after
    train.nan_patience of them in a row the run fails with where it went wrong and what to
    try. One finite step resets the count."""
    if not all_nonfinite:
        progress.nan_intervals, progress.nan_since_step = 0, None
        return
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
