"""The torch side of a task: the record the loop drives, and what the classification tasks
share.

A `Task` is a record of four functions and two names, not a class hierarchy:
- `to_device(batch, training)`: the loader's batch on the device as a `Batch` (normalised,
  laid out, mixed for images; inputs and shifted targets for tokens);
- `loss(outputs, batch)`: the training objective;
- `sums(outputs, batch, loss, training)`: the figures to accumulate, as one device vector
  (counts and sums only, so micro-steps, intervals and ranks add up; nothing is read back per
  step); what only evaluation reports is left at zero in training;
- `values(sums)`: those sums read back as named metrics (accuracy, perplexity, ...).
`unit` names what throughput counts (images, tokens, clouds) and `unit_sum` which sum counts it
(None: the samples are the unit). Evaluation runs the same functions in eval mode. A task may
also act at the loop's moments (`moment`: an epoch's start and end, an evaluation's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from hpctrain.errors import ConfigError
from hpctrain.tasks.tensors import first_rows


@dataclass
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor  # what the loss compares with (soft labels under mixing)
    labels: torch.Tensor  # what the metrics compare with

    def first(self, rows: int) -> Batch:
        """The first `rows` samples (evaluation leaves out the sampler's padding repeats)."""
        return Batch(first_rows(self.inputs, rows), self.targets[:rows], self.labels[:rows])


@dataclass(frozen=True)
class Task:
    name: str
    unit: str  # what throughput counts: images | tokens | clouds
    sum_names: tuple[str, ...]
    unit_sum: str | None
    to_device: Callable[[object, bool], Batch]
    loss: Callable[[torch.Tensor, Batch], torch.Tensor]
    sums: Callable[[torch.Tensor, Batch, torch.Tensor, bool], torch.Tensor]
    values: Callable[[dict], dict]
    own_metrics: tuple[str, ...] = ()  # the recipe's task.metrics, recorded in training too
    # the task's own code at the loop's moments (train_start, train_epoch_start/end,
    # validation_start/end, train_end: a LightningModule's hooks, lightning.HOOKS), given the
    # evaluation's sums so far on this rank (None in training): the sums it logged there,
    # added to the interval's or the evaluation's; None: a task without any
    moment: Callable[[str, torch.Tensor | None], torch.Tensor] | None = None
    # whether the run evaluates: not a LightningModule without a validation_step (as
    # Lightning's Trainer runs no validation loop for it)
    evaluates: bool = True
    # the validation figures, where they read otherwise than the training's `values` (a
    # LightningModule's names); None: `values`
    eval_values: Callable[[dict], dict] | None = None
    # what the task's code logged after a step's figures were recorded (a LightningModule's
    # on_before_optimizer_step and on_train_batch_end): sums for the interval under way, or
    # None where it logged nothing
    after_step: Callable[[], torch.Tensor | None] | None = None
    # the figures of the training epoch just ended (read at its train_epoch_end moment),
    # recorded as an `epoch` record; None: a task without any
    epoch_figures: Callable[[], dict] | None = None
    # why the run is to end after this step, as completed (a Lightning callback's
    # trainer.should_stop: EarlyStopping), or None; None: a task that never asks
    stop_asked: Callable[[], str | None] | None = None


MASK = "attention_mask"  # where your batches say which positions are real (Hugging Face's)


def padding_counted(task: Task) -> Task:
    """`task` with the share of padded positions of batches that carry an attention_mask
    (your collate padded them: DataCollatorWithPadding), as `padding_fraction`; batches
    without one count none, and the figure is left out."""
    def sums(outputs, batch: Batch, loss, training: bool) -> torch.Tensor:
        own = task.sums(outputs, batch, loss, training)
        mask = batch.inputs.get(MASK) if isinstance(batch.inputs, Mapping) else None
        counts = own.new_zeros(2) if mask is None else \
            torch.stack([mask.sum().to(own.dtype), own.new_full((), mask.numel())])
        return torch.cat([own, counts])

    def values(s: dict) -> dict:
        positions = s["positions"]
        return {**task.values(s), **({"padding_fraction": 1 - s["real_positions"] / positions}
                                     if positions else {})}
    return dataclasses.replace(task, sum_names=(*task.sum_names, "real_positions",
                                                "positions"), sums=sums, values=values)


def top1_sums(num_classes: int, model_name: str) -> Callable:
    """The sums of top-1 accuracy, for logits of `num_classes` classes: a model with another
    number of outputs (a factory that was not given the data's classes trains a 1,000-way
    head on 8 classes without a word) is refused at its first batch, naming the setting."""
    def sums(logits, batch: Batch, loss, training: bool) -> torch.Tensor:
        if logits.shape[-1] != num_classes:
            raise ConfigError(
                f"model.name {model_name} gives {logits.shape[-1]} outputs per sample, but "
                f"the data has {num_classes} classes: build it for the data's classes (a "
                f"factory's num_classes parameter, or model.kwargs.num_classes={num_classes})")
        correct = (logits.argmax(dim=1) == batch.labels).sum()
        rows = len(batch.labels)
        return torch.stack([correct.float(), correct.new_full((), rows, dtype=torch.float32),
                            loss.detach().float() * rows])
    return sums


TOP1_SUMS = ("correct", "samples", "loss_sum")  # the loss weighted by the rows


def top1_accuracy(sums: dict) -> dict:
    """Top-1 accuracy and the mean loss per sample (val_loss in evaluation)."""
    samples = max(sums["samples"], 1)
    return {"accuracy": sums["correct"] / samples, "loss": sums["loss_sum"] / samples}


def logits_of(outputs) -> torch.Tensor:
    """The logits of a model that returns them alone, as (logits, regulariser), or among
    named outputs: a mapping or an object with `logits` (a Hugging Face ModelOutput, which is
    both). Named outputs without them are refused, naming what they hold."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, tuple):
        return outputs[0]
    logits = _named(outputs, "logits")
    if logits is None:
        held = list(outputs) if isinstance(outputs, Mapping) else \
            [name for name in getattr(outputs, "__dict__", {}) if not name.startswith("_")]
        raise ConfigError(f"the model returned a {type(outputs).__name__} holding "
                          f"{', '.join(held) or 'nothing'}: hpctrain reads its `logits` (and "
                          "its `loss`, where it computes one); return a tensor, or name "
                          "them so")
    return logits


def model_loss(outputs) -> torch.Tensor | None:
    """The loss a model computed itself (a Hugging Face model given its `labels`: its
    output's `loss`), or None."""
    if isinstance(outputs, (torch.Tensor, tuple)):
        return None
    return _named(outputs, "loss")


def first_outputs(outputs, keep: int, rows: int):
    """The outputs of a batch's first `keep` of its `rows` (evaluation leaves out the
    sampler's padding repeats): all of them where it keeps every row; else named outputs as a
    dict of their rows kept, without the model's own loss, which counted every row (the
    task's loss is taken on the rows kept instead)."""
    if keep == rows:
        return outputs
    if isinstance(outputs, (torch.Tensor, tuple)):
        return outputs[:keep]
    named = outputs.items() if isinstance(outputs, Mapping) else vars(outputs).items()
    return {name: value[:keep] if isinstance(value, torch.Tensor) and value.dim() and
            value.shape[0] == rows else value for name, value in named if name != "loss"}


def preferring_model_loss(criterion: Callable) -> Callable:
    """A task's loss(outputs, batch): the model's own where it computed one (model_loss),
    `criterion`'s otherwise."""
    def loss(outputs, batch: Batch) -> torch.Tensor:
        own = model_loss(outputs)
        return criterion(outputs, batch) if own is None else own
    return loss


def _named(outputs, name: str):
    """The output called `name` of a mapping or an object holding named outputs, or None."""
    if isinstance(outputs, Mapping):
        return outputs.get(name)
    return getattr(outputs, name, None)


def with_regulariser(criterion: Callable) -> Callable:
    """`criterion(outputs, targets)`, plus the regulariser of a model that returns
    (logits, regulariser) while training (PointNet's feature transform)."""
    def loss(outputs, targets: torch.Tensor) -> torch.Tensor:
        if isinstance(outputs, tuple):
            return criterion(outputs[0], targets) + outputs[1]
        return criterion(outputs, targets)
    return loss
