"""Samples that are neither images, token blocks nor point clouds: your own tensors.

A sample is (inputs, target). The inputs are a tensor (or array) of any shape, or a tuple or
mapping of them (a dict, Hugging Face's BatchEncoding): the model is called as model(x),
model(*x) or model(**x). The target is what the task learns: a class index (classification),
a number or a float tensor (regression). A model whose forward takes `labels` (Hugging Face's)
is given them among its keyword inputs and computes its own loss, which the task then uses
(`steps.model_loss`).
Nothing is normalised or laid out: the tensors reach the model as the dataset made them,
floating ones in torch's default dtype (NumPy's float64 arrays would not meet float32
weights).

torch is imported when a batch is moved, never when a recipe is read (`spec.py`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

KIND = "tensors"  # the data kind of these tasks (TaskSpec.data_kind)
# hpctrain.fit's settings for the tasks on your own tensors (TaskSpec.fit_defaults): AdamW,
# which trains an MLP, a 1-D network or a transformer where images' SGD at 0.1 may not
FIT_DEFAULTS = {"optim.name": "adamw", "optim.lr": 1e-3, "optim.weight_decay": 0.01}
# the keys of a dict batch that hold its target (Hugging Face's collators say "labels")
TARGET_KEYS = ("labels", "label", "targets", "target")


def each(value, fn):
    """`value` with `fn` applied to every tensor (or array) in it, however nested in tuples,
    lists and mappings (a mapping of another type than dict kept as its type where it is made
    of a dict: Hugging Face's BatchEncoding)."""
    if isinstance(value, Mapping):
        mapped = {key: each(item, fn) for key, item in value.items()}
        return mapped if type(value) is dict else _same_kind(value, mapped)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(each(item, fn) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(each(item, fn) for item in value)
    return fn(value)


def moved(value, device):
    """`value` (a tensor, or a tuple, list or dict of them) on `device`; floating tensors in
    the default dtype."""
    import torch

    def move(tensor):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        if tensor.is_floating_point() and tensor.dtype != torch.get_default_dtype():
            tensor = tensor.to(torch.get_default_dtype())
        return tensor.to(device, non_blocking=True)
    return each(value, move)


def _same_kind(mapping: Mapping, items: dict) -> Mapping:
    """`items` as a mapping of `mapping`'s type, or as a dict where that type is not made of
    one."""
    try:
        return type(mapping)(items)
    except TypeError:
        return items


def first_rows(value, rows: int):
    """The first `rows` samples of a batch's inputs, however they are nested."""
    return each(value, lambda tensor: tensor[:rows])


def call(model, inputs):
    """The model on a batch's inputs: model(x), model(*x) for a tuple or list, model(**x) for
    a mapping."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def split(batch) -> tuple[object, object]:
    """(inputs, target) of a batch as your collate function made it: a pair; a tuple or list
    of more, whose last is the target and the others the inputs (model(*inputs)); a mapping
    (a dict, a BatchEncoding) holding one of TARGET_KEYS, the rest its inputs
    (model(**rest)). A ValueError names what else it is."""
    if isinstance(batch, Mapping):
        keys = [key for key in TARGET_KEYS if key in batch]
        if len(keys) == 1 and len(batch) > 1:
            return {k: v for k, v in batch.items() if k != keys[0]}, batch[keys[0]]
        raise ValueError(f"a {type(batch).__name__} with the keys "
                         f"{', '.join(map(repr, batch))}: its target needs one of the keys "
                         f"{', '.join(TARGET_KEYS)}")
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return (batch[0] if len(batch) == 2 else tuple(batch[:-1])), batch[-1]
    raise ValueError(f"a {type(batch).__name__}, not (inputs, target) nor a dict with one of "
                     f"the keys {', '.join(TARGET_KEYS)}")


def row(inputs, target, index: int) -> tuple[object, object]:
    """Sample `index` of a batch's (inputs, target), as a sample of (inputs, target)."""
    return each(inputs, lambda tensor: tensor[index]), target[index]


LABELS = "labels"  # the keyword Hugging Face's models take their target under


def forward_keywords(model) -> frozenset[str]:
    """The keywords `model`'s forward takes (none where it has no forward, or a builtin's
    without a signature)."""
    try:
        return frozenset(inspect.signature(model.forward).parameters)
    except (AttributeError, TypeError, ValueError):
        return frozenset()


def labels_keyword(model) -> str | None:
    """The keyword `model`'s forward takes its target under, so that it computes its own loss
    (Hugging Face's models: `labels`), or None for a model that takes none."""
    return LABELS if LABELS in forward_keywords(model) else None


def with_labels(inputs, target, keyword: str | None):
    """The model's inputs with the target under `keyword` (labels_keyword), where the inputs
    are keyword inputs (a mapping) and the model takes one; the inputs as they are
    otherwise."""
    if keyword is None or not isinstance(inputs, Mapping):
        return inputs
    return {**inputs, keyword: target}
