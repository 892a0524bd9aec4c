"""How your own samples become batches: your collate function (`data.collate`, or
`hpctrain.fit(collate_fn=...)`) or torch's default collation, checked.

- The run's collate (`collate_for`): yours where you gave one, its batch reaching the task
  and the model as it made it (a pair, a tuple whose last item is the target, a dict with a
  `labels` key: tasks/tensors.split); else torch's `default_collate`, which stacks samples
  and so needs them of one shape. hpctrain's own datasets keep their kind's batching.
- Before training, the few samples read of each split are batched once (`batched_rows`):
  samples whose shapes differ, without a collate that pads them, are refused in one line
  naming two of them and their shapes, and a batch that does not say its target is refused.
- During training, a batch that cannot be made (shapes that differ past the samples read)
  is the same one line (`CheckedCollate`), from a loader worker too (worker_signals.py):
  never torch's "Trying to resize storage that is not resizable".
- Bucketing (`data.bucketing`): the lengths samples are batched by (`lengths_of`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate

from hpctrain import user_code
from hpctrain.errors import DataError
from hpctrain.tasks import tensors

HOW_TO_PAD = ("give a collate function that pads a batch (data.collate: file.py:pad, or "
              "hpctrain.fit(collate_fn=pad)), or make every sample one shape in your dataset "
              "(pad a sequence to the longest, resize an image)")


def yours(data, given=None) -> tuple[Callable, str] | None:
    """(your collate function, its name in messages): data.collate, else the one your
    DataLoader sets (`given`: given_loaders.LoaderSettings); None: torch's default."""
    if data.collate:
        return user_code.load(data.collate, "data.collate"), f"data.collate {data.collate}"
    collate = getattr(given, "collate", None)
    if collate is not None:
        return collate, f"your DataLoader's collate_fn {getattr(collate, '__name__', '')}"
    return None


def collate_for(data, given=None) -> Callable | None:
    """The collate function the run's loaders batch with: yours (`yours`), or torch's
    default for your own samples, each checked (CheckedCollate); hpctrain's datasets' own
    kind's (None: torch's default)."""
    if not data.from_user_code:
        return data.kind_spec.collate(data)
    collate, name = yours(data, given) or (default_collate, None)
    return CheckedCollate(collate, data.dataset, name)


def shape_of(value):
    """`value`'s tensors and arrays as their shapes, nested as `value` is; anything else as
    its type's name (a label: 'int')."""
    def shape(item):
        if isinstance(item, (torch.Tensor, np.ndarray)):
            return tuple(item.shape)
        return len(item) if isinstance(item, str) else type(item).__name__
    return tensors.each(value, shape)


def _said(shape) -> str:
    """A shape structure in words: `{input_ids: (12,)}`, `[(12,), int]`."""
    if isinstance(shape, dict):
        return "{" + ", ".join(f"{key}: {_said(item)}" for key, item in shape.items()) + "}"
    if isinstance(shape, list) or (isinstance(shape, tuple) and not all(
            isinstance(size, int) for size in shape)):
        return "[" + ", ".join(_said(item) for item in shape) + "]"
    return str(shape)


def differing(samples: Sequence) -> tuple[int, int] | None:
    """The positions of two samples whose shapes differ (the first and another), or None."""
    first = shape_of(samples[0]) if samples else None
    for position, sample in enumerate(samples[1:], 1):
        if shape_of(sample) != first:
            return 0, position
    return None


def uneven(what: str, samples: tuple, reference: str, collate: str | None,
           err: BaseException) -> DataError:
    """The one line for two samples of different shapes that could not be batched."""
    shapes = [shape_of(sample) for sample in samples]
    if all(isinstance(shape, (tuple, list)) and len(shape) == 2 and
           not isinstance(shape[0], int) for shape in shapes) and shapes[0][1] == shapes[1][1]:
        said = f"inputs {_said(shapes[0][0])} and {_said(shapes[1][0])}"  # (inputs, target)
    else:
        said = f"{_said(shapes[0])} and {_said(shapes[1])}"
    if collate:
        return DataError(f"data.dataset: {reference}: {what} differ in shape ({said}), and "
                         f"{collate} raised {user_code.why(err)}")
    return DataError(f"data.dataset: {reference}: {what} differ in shape ({said}), which "
                     f"torch's default collation cannot stack: {HOW_TO_PAD}")


class CheckedCollate:
    """A run's collate function: a batch it cannot make from samples of different shapes is
    a DataError in one line (uneven), not torch's stack error; any other error of your
    collate is yours, raised as it is. Picklable (loader workers), by its function."""

    def __init__(self, collate: Callable, reference: str, collate_reference: str | None):
        self.collate, self.reference = collate, reference
        self.collate_reference = collate_reference

    def __call__(self, samples: list):
        try:
            return self.collate(samples)
        except Exception as err:
            pair = differing(samples)
            if pair is None:
                raise
            raise uneven("two samples of a batch", tuple(samples[p] for p in pair),
                         self.reference, self.collate_reference, err) from None


def batched_rows(read: list[tuple[int, object]], split: str, data,
                 collate: tuple[Callable, str] | None) -> list[tuple[int, object]]:
    """The samples read of a split ((index, sample) pairs) batched once as training will;
    with your `collate` (`yours`), its batch's rows as (inputs, target) samples, for the
    sample checks (the samples themselves are your collate's business). A DataError for
    samples that cannot be batched (shapes that differ, named) or a batch without a
    target."""
    reference, mine = data.dataset, collate[1] if collate else None
    indices, samples = [index for index, _ in read], [sample for _, sample in read]
    try:
        batch = (collate[0] if collate else default_collate)(samples)
    except Exception as err:  # your collate, or torch's stacking
        pair = differing(samples)
        if pair is not None:
            raise uneven(f"{split} samples {indices[pair[0]]} and {indices[pair[1]]}",
                         tuple(samples[p] for p in pair), reference, mine, err) from None
        if not mine:
            raise
        raise DataError(f"{mine} cannot batch {split} samples "
                        f"{', '.join(map(str, indices))} of {reference}: "
                        f"{user_code.why(err)}") from None
    if not mine or data.targets == "any":  # a LightningModule's step takes the batch whole
        return read
    try:
        inputs, target = tensors.split(batch)
    except ValueError as err:
        raise DataError(f"{mine} made a batch that is {err}; make it (inputs, "
                        "target), or a dict with a 'labels' key") from None
    rows = len(target) if hasattr(target, "__len__") else 0
    if rows != len(samples):
        raise DataError(f"{mine} made a batch of {len(samples)} {split} samples "
                        f"whose target is {_said(shape_of(target))}: one target per sample")
    return [(index, tensors.row(inputs, target, position))
            for position, index in enumerate(indices)]


def sample_length(sample) -> int:
    """A sample's length, what bucketing sorts by: the first dimension of its inputs' first
    tensor (or list), where the sample is (inputs, target)."""
    inputs = sample[0] if isinstance(sample, (tuple, list)) and len(sample) == 2 else sample
    while isinstance(inputs, (dict, tuple, list)) and not (
            isinstance(inputs, list) and inputs and isinstance(inputs[0], (int, np.integer))):
        inputs = next(iter(inputs.values() if isinstance(inputs, dict) else inputs))
    if isinstance(inputs, (torch.Tensor, np.ndarray)):
        return int(inputs.shape[0]) if inputs.ndim else 1
    return len(inputs)


def lengths_of(dataset, reference: str, rank: int = 0) -> list[int]:
    """Every sample's length: the dataset's `lengths` (a sequence of one int per sample), or
    each sample read once and measured (said, with how to skip it)."""
    given = getattr(dataset, "lengths", None)
    if given is not None:
        if len(given) != len(dataset):
            raise DataError(f"data.dataset: {reference}: its `lengths` has {len(given)} "
                            f"entries for {len(dataset)} samples: one length per sample")
        return [int(length) for length in given]
    started = time.perf_counter()
    try:
        lengths = [sample_length(dataset[index]) for index in range(len(dataset))]
    except (StopIteration, TypeError, IndexError) as err:
        raise DataError(f"data.bucketing: {reference}: a sample has no length ({err}); "
                        "bucketing sorts by the first dimension of a sample's inputs") from None
    if rank == 0:
        print(f"hpctrain: data.bucketing: read {len(lengths)} samples' lengths in "
              f"{time.perf_counter() - started:.1f} s (a `lengths` attribute on your dataset, "
              "one int per sample, skips this)", flush=True)
    return lengths
