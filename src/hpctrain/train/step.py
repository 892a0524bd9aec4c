"""One training step, in the order it runs: fetch a batch, move it to the device, the hook
before the forward pass, forward and loss, backward, then the optimiser's update.

The engine (loop.py) and `hpctrain memory` (memory/simulate.py) drive this same step, so what
memory predicts is the step that trains. Each phase runs inside `phase(name)`, a context named
for one of the profiler's regions (profiling/names.py REGIONS): the engine passes
`profiling.regions.region`, which marks the trace and Nsight Systems' timeline; memory passes
one that also tells its storage counter which phase allocates.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpctrain.parallel.pipeline import Pipeline
from hpctrain.profiling.regions import region
from hpctrain.tasks import tensors
from hpctrain.tasks.steps import Batch
from hpctrain.train.hardware.precision import Precision
from hpctrain.train.optimizers.optim import StepSchedule, WeightEma

Phase = Callable[[str], contextlib.AbstractContextManager]


def _as_moved(batch: Batch) -> Batch:
    return batch


def _always_in_sync(last_micro_batch: bool) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@dataclass
class BatchHooks:
    """A module's own code at a training batch's moments: a LightningModule's per-batch
    hooks (tasks/lightning_step.py), in Lightning's order. With them the gradients are
    zeroed as Lightning zeroes them, after the first micro-batch's forward and before its
    backward (without them, right after the update, which frees them sooner)."""

    before_zero_grad: Callable[[], None]
    before_backward: Callable[[torch.Tensor], None]  # the loss about to be backpropagated
    after_backward: Callable[[], None]
    before_optimizer_step: Callable[[], None]  # gradients unscaled, not yet clipped
    batch_end: Callable[[], None]  # a micro-batch done (the last: after the update)


@dataclass
class Step:
    """What one optimiser step is made of; `build.py` assembles the engine's, memory its own."""

    model: nn.Module  # what the step calls: the DDP or FSDP wrapper, compiled under compile
    params: list[nn.Parameter]  # the ones trained (clipped and stepped)
    to_device: Callable[[Any], Batch]  # the task's: a loader's batch on the device
    loss: Callable[[Any, Batch], torch.Tensor]  # the task's: the outputs against the targets
    precision: Precision  # autocast, the (scaled) backward, clipping and the optimiser step
    optimizer: torch.optim.Optimizer
    clip_norm: float | None = None
    accumulate: int = 1  # micro-batches whose gradients add up to one update
    scheduler: StepSchedule | None = None  # stepped after each update (or the task's own)
    ema: WeightEma | None = None  # the averaged weights, updated after each update
    pipeline: Pipeline | None = None  # this rank's stage: its schedule does forward+backward
    # gradient_sync(last micro-batch): DDP and FSDP reduce gradients only on the last
    gradient_sync: Callable[[bool], contextlib.AbstractContextManager] = _always_in_sync
    # the context the loss and its backward run in (loss parallelism's, under tensor parallel)
    loss_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # between the device move and the forward pass: where context parallelism would give
    # each rank its part of the sequence
    before_forward: Callable[[Batch], Batch] = _as_moved
    hooks: BatchHooks | None = None  # a LightningModule's per-batch hooks


def take_step(step: Step, next_batch: Callable[[], Any], phase: Phase = region,
              record: Callable[[Any, Batch, torch.Tensor], None] | None = None) -> float:
    """One optimiser step over `step.accumulate` micro-batches from `next_batch()`;
    `record(outputs, batch, loss)` sees each micro-batch's figures (a pipeline's last stage
    only). Returns the seconds spent waiting for batches."""
    waited = 0.0
    for micro in range(step.accumulate):
        started = time.perf_counter()
        with phase("data_wait"):
            loaded = next_batch()
        waited += time.perf_counter() - started
        with phase("h2d_copy"):
            batch = step.to_device(loaded)
        batch = step.before_forward(batch)
        if step.pipeline is not None:  # the stages' schedule runs forward and backward
            with phase("pipeline"), step.loss_context():
                outputs, loss = step.pipeline.train_step(batch, step.precision)
        else:
            with step.gradient_sync(micro == step.accumulate - 1), step.loss_context():
                outputs, loss = forward(step, batch, phase)
                hooked(step, micro, loss)
                with phase("backward"):
                    step.precision.backward(loss if step.accumulate == 1 else
                                            loss / step.accumulate)
                if step.hooks is not None:
                    step.hooks.after_backward()
        if record is not None and outputs is not None:
            record(outputs, batch, loss)
        del loaded, batch, outputs, loss  # none of it lives on into the update's peak
        if step.hooks is not None and micro < step.accumulate - 1:
            step.hooks.batch_end()
    with phase("optimizer"):
        step.precision.step(step.optimizer, step.params, step.clip_norm,
                            step.hooks.before_optimizer_step if step.hooks else None)
        if step.scheduler is not None:
            step.scheduler.step()
        if step.hooks is None:
            step.optimizer.zero_grad(set_to_none=True)
        if step.ema is not None:
            step.ema.update()
    if step.hooks is not None:
        step.hooks.batch_end()
    return waited


def hooked(step: Step, micro: int, loss: torch.Tensor) -> None:
    """A module's hooks between its forward and its backward: the first micro-batch zeroes
    the gradients there, after on_before_zero_grad, as Lightning does; then
    on_before_backward."""
    if step.hooks is None:
        return
    if micro == 0:
        step.hooks.before_zero_grad()
        step.optimizer.zero_grad(set_to_none=True)
    step.hooks.before_backward(loss)


def forward(step: Step, batch: Batch, phase: Phase = region) -> tuple[Any, torch.Tensor]:
    """The forward pass and the loss under autocast: (outputs, loss). What it leaves alive is
    what backward needs (memory reads it at the end of this phase)."""
    with phase("forward"), step.precision.autocast():
        outputs = tensors.call(step.model, batch.inputs)
        return outputs, step.loss(outputs, batch)
