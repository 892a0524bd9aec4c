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

import torch
from torch import nn

from hpctrain.tasks import tensors
from hpctrain.train.checkpoint import capture_rng, restore_rng
from hpctrain.train.progress_state import Progress


@torch.no_grad()
def evaluate(parts, model: nn.Module, stopper=None) -> dict | None:
    """The task's metrics on the validation set, named val_<metric> (a LightningModule's as
    it logged them); None when a stop (signal or deadline) was agreed on midway."""
    task = parts.task
    model.eval()
    sums = torch.zeros(len(task.sum_names), device=parts.device, dtype=torch.float64)
    real = parts.data.val_sampler.real_count
    seen = 0
    streams = capture_rng()
    try:
        if task.moment is not None:
            sums += task.moment("validation_start").to(sums.dtype)
        for host_batch in parts.data.val_loader:
            if stopper is not None and stopper.check() is not None:
                return None
            batch = task.to_device(host_batch, training=False)
            rows = batch.labels.shape[0]
            keep = max(0, min(rows, real - seen))
            seen += rows
            with parts.precision.autocast():
                outputs = tensors.call(model, batch.inputs) if parts.pipeline is None else \
                    parts.pipeline.forward(batch.inputs)
            if keep and outputs is not None:  # a pipeline's output is on its last stage
                kept = batch.first(keep)
                with parts.loss_context():
                    loss = task.loss(outputs[:keep], kept)
                    sums += task.sums(outputs[:keep], kept, loss, False).to(sums.dtype)
        if task.moment is not None:
            sums += task.moment("validation_end").to(sums.dtype)
    finally:
        model.train()
        restore_rng(streams)
    totals = parts.distributed.sum_(sums).tolist()
    values = task.values(dict(zip(task.sum_names, totals)))
    spec = parts.config.task_spec
    return {spec.figure_name("val", name): value for name, value in values.items()
            if name != "padding_fraction"}


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
