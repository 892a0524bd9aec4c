"""The step `hpctrain memory` simulates, for a recipe of your own tensors: its batches have
the shapes and dtypes of the training set's first sample (read once, through the recipe's
factory).

Every tensor of a sample (inputs of any nesting, the target) becomes a batch of zeros of its
shape and dtype, floating ones in the default dtype as training moves them (tasks/tensors.py);
zeros are a valid class and a valid mask, and what a step holds does not depend on values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from hpctrain.config import Config
from hpctrain.tasks.tensors import each, row, split

_READ: dict[str, TensorSample] = {}  # data settings -> the sample read for them
_SIZES: dict[str, int | None] = {}  # data settings -> the training set's samples


@dataclass(frozen=True)
class TensorSample:
    inputs: object  # the first training sample's inputs: a tensor, tuple, list or dict
    target: torch.Tensor | None  # None: a LightningModule's sample, all of it in `inputs`
    num_classes: int | None  # as the data says it (None: the model's output says it)
    collate: Callable | None = None  # your data.collate: a batch is its batch of `raw`s
    raw: object = None  # the sample a batch repeats, as your dataset made it
    note: str | None = None  # which sample that is, for the estimate's notes


def _data_key(config: Config) -> str:
    """What the data read for a configuration depends on: its data settings, task and seed."""
    return json.dumps([config.data.model_dump(mode="json"), config.task.name, config.seed],
                      sort_keys=True)


def training_samples(config: Config) -> int | None:
    """How many samples the training set holds, read once per data settings; None for a
    stream or data that cannot be read here (the estimate goes on without the bound)."""
    from hpctrain.data.loader import build_datasets
    from hpctrain.errors import UserError

    key = _data_key(config)
    if key not in _SIZES:
        try:
            _SIZES[key] = len(build_datasets(config.data, config.seed)[0])
        except (UserError, TypeError):  # unreadable here, or a stream without a length
            _SIZES[key] = None
    return _SIZES[key]


def first_sample(config: Config) -> TensorSample:
    """The training set's first sample, as tensors; read once per data settings (an estimate
    and its advice ask a dozen times). With your collate, the longest sample read instead,
    as the first row of the batch your collate makes of it."""
    from hpctrain.data.batching import yours
    from hpctrain.data.loader import build_datasets
    from hpctrain.data.user_datasets import loader_settings

    key = _data_key(config)
    if key not in _READ:
        train, _, num_classes = build_datasets(config.data, config.seed)
        given = loader_settings(config.data, config.seed)[0] if \
            config.data.from_user_code else None
        if collate := yours(config.data, given):  # data.collate, or your DataLoader's
            _READ[key] = _collated(config, train, num_classes, *collate)
        elif config.data.targets == "any":  # a LightningModule's step takes the whole sample
            _READ[key] = TensorSample(each(train[0], torch.as_tensor), None, num_classes)
        else:
            _READ[key] = _sample(*train[0], num_classes)
    return _READ[key]


def _sample(inputs, target, num_classes: int | None, **collated) -> TensorSample:
    target = torch.as_tensor(target)  # a multi-hot vector of bools trains as floats
    return TensorSample(each(inputs, torch.as_tensor), target.float() if
                        target.dtype == torch.bool else target, num_classes, **collated)


def _collated(config: Config, train, num_classes: int | None, collate: Callable,
              named: str) -> TensorSample:
    """The longest sample (by the dataset's `lengths`, else of the first, middle and last),
    which your collate pads least: a step's peak at the longest batch."""
    from hpctrain.data.batching import sample_length

    dataset = getattr(train, "dataset", train)
    lengths = getattr(dataset, "lengths", None)
    candidates = range(len(train)) if lengths is not None else \
        sorted({0, len(train) // 2, len(train) - 1})
    length = (lambda i: int(lengths[i])) if lengths is not None else \
        (lambda i: sample_length(train[i]))
    index = max(candidates, key=length)
    raw = train[index]
    note = (f"batches of training sample {index} (length {length(index)}, the longest "
            + ("in the dataset's lengths" if lengths is not None else "of samples "
               + ", ".join(map(str, candidates))) + f") made by {named}")
    batch = collate([raw])
    if config.data.targets == "any":
        return TensorSample(each(batch, torch.as_tensor), None, num_classes, collate, raw, note)
    inputs, target = row(*split(batch), 0)
    return _sample(inputs, target, num_classes, collate=collate, raw=raw, note=note)


def leading_shape(sample: TensorSample) -> tuple[int, ...]:
    """The shape the report prints: the inputs', or their first tensor's where nested."""
    inputs = sample.inputs
    while isinstance(inputs, (dict, tuple, list)):
        inputs = next(iter(inputs.values() if isinstance(inputs, dict) else inputs))
    return tuple(inputs.shape)


def batch_of(sample: TensorSample, batch: int, device: torch.device) -> tuple[object, object]:
    """(inputs, target) of `batch` zero samples shaped as `sample`'s, on `device`; with your
    collate, zeros shaped as its batch of `batch` copies of the sample."""
    def zeros(value, rows: tuple[int, ...] = (batch,)):
        dtype = torch.get_default_dtype() if value.is_floating_point() else value.dtype
        return torch.zeros((*rows, *value.shape), dtype=dtype, device=device)

    if sample.collate is not None:  # made on the CPU (outside a fake mode), then its shapes
        with torch.device("cpu"), unset_fake_temporarily():
            made = sample.collate([sample.raw] * batch)
        if sample.target is None:
            return each(made, lambda value: zeros(torch.as_tensor(value), ())), None
        inputs, target = split(made)
        return each(inputs, lambda value: zeros(torch.as_tensor(value), ())), \
            zeros(torch.as_tensor(target), ())
    return each(sample.inputs, zeros), None if sample.target is None else zeros(sample.target)
