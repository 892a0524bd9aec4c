"""The step `hpctrain memory` simulates, for a recipe of your own tensors: its batches have
the shapes and dtypes of the training set's first sample (read once, through the recipe's
factory), and its loss is the task's own.

Every tensor of a sample (inputs of any nesting, the target) becomes a batch of zeros of its
shape and dtype, floating ones in the default dtype as training moves them (tasks/tensors.py);
zeros are a valid class and a valid mask, and what a step holds does not depend on values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from hpctrain.config import Config
from hpctrain.tasks.spec import TaskSetup
from hpctrain.tasks.steps import Batch, logits_of
from hpctrain.tasks.tensors import each

_READ: dict[str, TensorSample] = {}  # data settings -> the sample read for them


@dataclass(frozen=True)
class TensorSample:
    inputs: object  # the first training sample's inputs: a tensor, tuple, list or dict
    target: torch.Tensor | None  # None: a LightningModule's sample, all of it in `inputs`
    num_classes: int | None  # as the data says it (None: the model's output says it)


def first_sample(config: Config) -> TensorSample:
    """The training set's first sample, as tensors; read once per data settings (an estimate
    and its advice ask a dozen times)."""
    from hpctrain.data.loader import build_datasets

    key = json.dumps([config.data.model_dump(mode="json"), config.task.name, config.seed],
                     sort_keys=True)
    if key not in _READ:
        train, _, num_classes = build_datasets(config.data, config.seed)
        if config.data.targets == "any":  # a LightningModule's step takes the whole sample
            _READ[key] = TensorSample(each(train[0], torch.as_tensor), None, num_classes)
            return _READ[key]
        inputs, target = train[0]
        target = torch.as_tensor(target)  # a multi-hot vector of bools trains as floats
        _READ[key] = TensorSample(each(inputs, torch.as_tensor), target.float() if
                                  target.dtype == torch.bool else target, num_classes)
    return _READ[key]


def leading_shape(sample: TensorSample) -> tuple[int, ...]:
    """The shape the report prints: the inputs', or their first tensor's where nested."""
    inputs = sample.inputs
    while isinstance(inputs, (dict, tuple, list)):
        inputs = next(iter(inputs.values() if isinstance(inputs, dict) else inputs))
    return tuple(inputs.shape)


def batch_of(sample: TensorSample, batch: int, device: torch.device) -> tuple[object, object]:
    """(inputs, target) of `batch` zero samples shaped as `sample`'s, on `device`."""
    def zeros(value):
        dtype = torch.get_default_dtype() if value.is_floating_point() else value.dtype
        return torch.zeros((batch, *value.shape), dtype=dtype, device=device)

    return each(sample.inputs, zeros), None if sample.target is None else zeros(sample.target)


def task_loss(config: Config, num_classes: int | None, device: torch.device):
    """criterion(outputs, targets): the task's own loss; where the data does not say the
    classes, the outputs do (their second axis, as training reads them: train/build.py)."""
    built = {}

    def criterion(outputs, targets):
        width = num_classes or logits_of(outputs).shape[1]
        if width not in built:
            built[width] = config.task_spec.build(TaskSetup(
                config, device, width, None, 1, image_batcher=lambda: None,
                up_axis=lambda: 2))
        return built[width].loss(outputs, Batch(None, targets, targets))
    return criterion
