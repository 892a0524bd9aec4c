"""Your own loss and metrics on a task: `task.loss: module:fn` and
`task.metrics: {name: module:fn}` (user_code.py resolves the references).

- The loss is called as `fn(outputs, targets)`: the model's outputs and the batch's targets
  (class indices; soft targets under mixup/CutMix; shifted ids for a language model). It must
  return one number, a 0-d tensor; the first call is checked.
- A metric is called as `fn(outputs, labels)` and returns the batch's *sum* (a count or a
  summed value, a 0-d tensor on the device). hpctrain adds the sums over steps, micro-steps and
  ranks as it does its own, reads them back only at logging intervals (no host sync per step),
  and reports each divided by the samples (tokens for a language model): `name` in training
  records, `val_name` in evaluation.
"""

from __future__ import annotations

import dataclasses

import torch

from hpctrain import user_code
from hpctrain.config import TaskConfig
from hpctrain.errors import ConfigError
from hpctrain.tasks.steps import Batch, Task


def _check_scalar(value, what: str, reference: str) -> None:
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        return
    shape = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) \
        else f"a {type(value).__name__}"
    raise ConfigError(f"{what} {reference} returned {shape}: return one number as a 0-d "
                      "tensor on the device (for example with .mean() or .sum())")


def with_user_functions(task: Task, config: TaskConfig) -> Task:
    """`task` with the recipe's own loss and metrics, if it names any."""
    if config.loss:
        task = dataclasses.replace(task, loss=_user_loss(config.loss))
    if config.metrics:
        task = _with_metrics(task, config.metrics)
    return task


def _user_loss(reference: str):
    fn = user_code.load(reference, "task.loss")
    checked = False

    def loss(outputs, batch: Batch) -> torch.Tensor:
        nonlocal checked
        value = fn(outputs, batch.targets)
        if not checked:  # once: a shape check costs nothing, but once is enough
            _check_scalar(value, "task.loss", reference)
            checked = True
        return value
    return loss


def _with_metrics(task: Task, metrics: dict[str, str]) -> Task:
    functions = {name: user_code.load(reference, f"task.metrics.{name}")
                 for name, reference in metrics.items()}
    checked = False

    def sums(outputs, batch: Batch, loss, training: bool) -> torch.Tensor:
        nonlocal checked
        own = [fn(outputs, batch.labels) for fn in functions.values()]
        if not checked:
            for name, value in zip(functions, own):
                _check_scalar(value, f"task.metrics.{name}", metrics[name])
            checked = True
        return torch.cat([task.sums(outputs, batch, loss, training).double(),
                          torch.stack([value.detach().double() for value in own])])

    def values(s: dict) -> dict:
        count = max(s[task.unit_sum or "samples"], 1)
        return {**task.values(s), **{name: s[f"metric:{name}"] / count for name in functions}}

    return dataclasses.replace(task, sum_names=(*task.sum_names,
                                                *(f"metric:{n}" for n in functions)),
                               sums=sums, values=values, own_metrics=tuple(functions))
