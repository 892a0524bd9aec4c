"""Evaluation on the validation set: the task's figures, every sample counted once over all
ranks, cut short when a stop is agreed on (a long evaluation must not eat the grace time
before Slurm's SIGKILL).

Every rank runs the same number of batches (the sampler pads with repeats, which FSDP's
collectives need); the repeats at the end of a rank's share are left out of the sums.

An evaluation draws nothing from the training's random streams (a DataLoader draws its seed
from torch's): the states are put back after it, so an evaluation cut short by a stop and done
again after the resume leaves training exactly where an undisturbed run would be.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from hpctrain.errors import Preempted
from hpctrain.monitor.beats import EVALUATION
from hpctrain.tasks import tensors
from hpctrain.tasks.steps import first_outputs
from hpctrain.train import run_summary
from hpctrain.train.bookkeeping import Clock
from hpctrain.train.checkpoints.checkpoint import capture_rng, restore_rng
from hpctrain.train.checkpoints.progress_state import Progress
from hpctrain.train.compilation import seconds_compiling
from hpctrain.train.preemption import Stopper
from hpctrain.train.run_record import finish_saving, save_checkpoint
from hpctrain.train.telemetry import Telemetry
from hpctrain.train.trial import TrialPruned
from hpctrain.train.validation.predictions import Predictions


@torch.no_grad()
def evaluate(parts, model: nn.Module, stopper=None) -> dict | None:
    """The task's metrics on the validation set, named val_<metric> (a LightningModule's as
    it logged them); None when a stop (signal or deadline) was agreed on midway."""
    task = parts.task
    model.eval()
    sums = torch.zeros(len(task.sum_names), device=parts.device, dtype=torch.float64)
    real = parts.data.val_sampler.real_count
    seen = 0
    compute = parts.config.task.compute_metrics
    predictions = Predictions(compute) if compute else None
    streams = capture_rng()
    try:
        if task.moment is not None:
            sums += task.moment("validation_start", None).to(sums.dtype)
        for host_batch in parts.data.val_loader:
            parts.beats.beat(EVALUATION)
            if stopper is not None and stopper.check() is not None:
                return None
            batch = task.to_device(host_batch, training=False)
            rows = batch.labels.shape[0]
            keep = max(0, min(rows, real - seen))
            seen += rows
            with parts.step.precision.autocast():
                outputs = tensors.call(model, batch.inputs) if parts.step.pipeline is None else \
                    parts.step.pipeline.forward(batch.inputs)
            if keep and outputs is not None:  # a pipeline's output is on its last stage
                kept, outputs = batch.first(keep), first_outputs(outputs, keep, rows)
                with parts.step.loss_context():
                    loss = task.loss(outputs, kept)
                    sums += task.sums(outputs, kept, loss, False).to(sums.dtype)
                if predictions is not None:
                    predictions.add(outputs, kept)
        if task.moment is not None:
            sums += task.moment("validation_end", sums).to(sums.dtype)
    finally:
        model.train()
        restore_rng(streams)
    totals = parts.distributed.sum_(sums).tolist()
    values = (task.eval_values or task.values)(dict(zip(task.sum_names, totals)))
    spec = parts.config.task_spec
    figures = {spec.figure_name("val", name): value for name, value in values.items()
               if name != "padding_fraction"}
    if predictions is not None:
        figures.update(predictions.figures(parts.distributed))
    return figures


def keep_best(progress: Progress, values: dict) -> None:
    """The evaluation's figures into the run's progress: the last, and the best so far."""
    progress.final_eval = values
    accuracy = values.get("val_accuracy")
    if accuracy is not None:
        progress.final_val_accuracy = accuracy
        progress.best_val_accuracy = max(accuracy, progress.best_val_accuracy or 0.0)
    loss = values.get("val_loss")
    if loss is not None and (progress.best_val_loss is None or loss < progress.best_val_loss):
        progress.best_val_loss = loss


def evaluate_and_record(parts, progress: Progress, clock: Clock, telemetry: Telemetry,
                        stopper: Stopper, evaluation: int) -> None:
    """Evaluate (the `evaluation`-th time), record it, and report it to the search when the
    run is one of its trials: TrialPruned when the study stops it. An evaluation a stop cuts
    short is owed (progress.eval_owed, checkpointed): the resume does it first."""
    start, compiled = time.perf_counter(), seconds_compiling()
    model = parts.fused_eval.module() if parts.fused_eval else parts.step.model
    progress.eval_owed = progress.step  # until recorded: a stop or a failure leaves it owed
    parts.beats.step = progress.step  # the steps trained, for its batches' beats
    values = evaluate(parts, model, stopper)
    seconds = time.perf_counter() - start  # the sums' read-back waited for the device
    clock.eval_seconds += seconds
    clock.eval_compile_seconds += seconds_compiling() - compiled
    if values is None:
        telemetry.message(f"step {progress.step}: evaluation cut short to stop in time")
        return
    progress.eval_owed = None
    keep_best(progress, values)
    if parts.step.ema is not None:
        values.update({f"{k}_ema": v for k, v in
                       evaluate(parts, parts.step.ema.module).items()})
    run = run_summary.totals(parts, progress, clock)  # where a leaderboard reads time to target
    telemetry.record("eval", progress.step, {
        **values, "epoch": progress.step / parts.steps_per_epoch, "eval_seconds": seconds,
        **{key: run[key] for key in ("elapsed_seconds", "device_hours", "energy_joules")}})
    telemetry.message(f"step {progress.step}: " + ("  ".join(  # None: undefined (R² of one value)
        f"{name} {'-' if value is None else f'{value:.4f}'}" for name, value in values.items())
        or "evaluated; the validation logged no figure"))
    if parts.trial is not None and parts.trial.prune(values, evaluation,
                                                     progress.step == parts.total_steps):
        raise TrialPruned(f"trial {parts.trial.number} pruned by the study after evaluation "
                          f"{evaluation} (step {progress.step})")


def owed_evaluation(parts, progress: Progress, clock: Clock, telemetry: Telemetry,
                    stopper: Stopper, evaluation: int) -> None:
    """The scheduled evaluation that a stop cut short, at the step the run resumed from, done
    before training on; the checkpoint of that step is saved again with it (the same
    weights), so a later resume neither repeats nor skips it."""
    telemetry.message(f"step {progress.step}: the evaluation a stop cut short, done now")
    evaluate_and_record(parts, progress, clock, telemetry, stopper, evaluation)
    if progress.eval_owed is not None:
        stop = stopper.check() or ("a stop", True)
        raise Preempted(f"stopped at step {progress.step} ({stop[0]}){owed(progress)}; "
                        f"checkpoint {progress.last_good_checkpoint} kept.", requeue=stop[1])
    save_checkpoint(parts, progress, clock, telemetry)
    finish_saving(parts)


def owed(progress: Progress) -> str:
    """What a stop message adds when the stop cut the step's evaluation short."""
    return "" if progress.eval_owed is None else \
        " during its evaluation, which the resume does first"
