"""Your own datasets: `data.dataset: package.module:make` or `path/to/file.py:make`.

The factory returns the training and validation `torch.utils.data.Dataset`s, as a pair or as
{"train": ..., "val": ...}; `data.kwargs` are passed to it, and so are the facts it names as
parameters: `path` (data.path), `image_size`, `num_points`, `seq_len`, `seed`. The training
set may also be a stream (an IterableDataset, streams.py). Map-style datasets take
hpctrain's sampler (an epoch-seeded order, split over ranks, resumed mid-epoch at the exact
batch). Randomness inside your `__getitem__` (`random`, NumPy, torch) comes from `seed`: in the
training process with data.num_workers=0, else in each worker reseeded at every epoch from
(seed, epoch, rank, worker) (seeding.py). Two runs draw the same augmentations; a run resumed
mid-epoch sees the same samples in the same batches, but not bitwise the same augmentations.

Samples, checked on a few indices before training (the first bad one is named, with what it
holds and what the task expects):
- image classification: (image, label); the image a uint8 (H, W, 3) tensor or array, which
  hpctrain normalises on the device as for its own data (data.mean, data.std), or a float
  (3, H, W) tensor already normalised, used as it is;
- point-cloud classification: (points, label), the points a float (N, 3) tensor or array;
- language modelling: a block of data.tokens.seq_len + 1 integer token ids (1-D), below the
  vocabulary's size: data.tokens.vocab_size, or the training dataset's `vocab_size`.
The label is an integer below the number of classes: `data.num_classes`, or the dataset's
`classes` (a list) or `num_classes`.
"""

from __future__ import annotations

from collections.abc import Sized

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from hpctrain import user_code
from hpctrain.config import DataConfig
from hpctrain.data.streams import first_items
from hpctrain.errors import DataError, UserError
from hpctrain.seeding import seed_worker


class ByIndex(Dataset):
    """Your dataset behind hpctrain's sampler, whose keys carry the epoch and size as well; a
    worker's random generators reseeded as each epoch begins."""

    def __init__(self, dataset: Dataset, seed: int = 0, rank: int = 0):
        self.dataset, self.seed, self.rank = dataset, seed, rank
        self.seeded_epoch = None  # in a worker: the epoch its generators were seeded for

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            worker = get_worker_info()
            if worker is not None and key[1] != self.seeded_epoch:
                seed_worker(self.seed, key[1], self.rank, worker.id)
                self.seeded_epoch = key[1]
            key = key[0]
        return self.dataset[int(key)]


def user_datasets(data: DataConfig, seed: int, rank: int = 0) -> tuple[Dataset, Dataset, int]:
    """(train, val, number of classes) from the factory data.dataset names, checked; `rank`:
    the data-parallel rank, which the workers' seeds derive from."""
    reference = data.dataset
    factory = user_code.load(reference, "data.dataset")
    tokens = data.kind == "tokens"
    facts = {"path": data.path, "image_size": data.image_size, "seed": seed,
             "num_points": data.points.num_points if data.kind == "points" else None,
             "seq_len": data.tokens.seq_len if tokens else None}
    made = user_code.call_factory(factory, "data.dataset", reference, facts, data.kwargs)
    train, val = _train_and_val(made, reference)
    num_classes = _vocabulary_of(train, data, reference) if tokens else \
        data.num_classes or _classes_of(train, reference)
    for split, dataset in (("train", train), ("val", val)):
        check_samples(dataset, split, reference, data.kind, num_classes, data.tokens.seq_len)
    # a stream is wrapped where the loader is made (streams.py): it needs the layout
    return train if isinstance(train, IterableDataset) else ByIndex(train, seed, rank), \
        ByIndex(val, seed, rank), num_classes


def _train_and_val(made, reference: str) -> tuple[Dataset, Dataset]:
    if isinstance(made, dict) and set(made) == {"train", "val"}:
        made = (made["train"], made["val"])
    if not (isinstance(made, (tuple, list)) and len(made) == 2):
        raise DataError(f"data.dataset: {reference} returned {_what(made)}; return the "
                        "training and validation datasets: (train, val) or "
                        "{'train': ..., 'val': ...}")
    for split, dataset in zip(("train", "val"), made):
        if isinstance(dataset, IterableDataset):
            if split == "val":
                raise DataError(f"data.dataset: {reference} returned an IterableDataset for "
                                "val; the validation set must be map-style (__getitem__ and "
                                "__len__: evaluation counts every sample once over all "
                                "processes); a training stream is fine")
            continue
        if not (hasattr(dataset, "__getitem__") and isinstance(dataset, Sized)):
            raise DataError(f"data.dataset: {reference} returned {_what(dataset)} for {split}, "
                            "not a map-style torch.utils.data.Dataset (__getitem__ and "
                            "__len__)")
        if len(dataset) == 0:
            raise DataError(f"data.dataset: the {split} dataset of {reference} is empty")
    return made[0], made[1]


def _classes_of(dataset, reference: str) -> int:
    if isinstance(getattr(dataset, "classes", None), (list, tuple)):
        return len(dataset.classes)
    if isinstance(getattr(dataset, "num_classes", None), int):
        return dataset.num_classes
    raise DataError(f"data.dataset: {reference}: how many classes? The training dataset has "
                    "no `classes` list or `num_classes`; set data.num_classes=N")


def _vocabulary_of(dataset, data: DataConfig, reference: str) -> int:
    if data.tokens.vocab_size:
        return data.tokens.vocab_size
    if isinstance(getattr(dataset, "vocab_size", None), int):
        return dataset.vocab_size
    raise DataError(f"data.dataset: {reference}: how large is the vocabulary? The training "
                    "dataset has no `vocab_size`; set data.tokens.vocab_size=N")


def _what(value) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"a {type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"a {type(value).__name__}"


def _torch_dtype(array) -> torch.dtype | None:
    if isinstance(array, torch.Tensor):
        return array.dtype
    try:
        return torch.from_numpy(np.empty(0, array.dtype)).dtype
    except TypeError:  # object or string arrays
        return None


def _problem(inputs, label, kind: str, num_classes: int) -> str | None:
    """What is wrong with one (inputs, label) sample for the task, or None."""
    if not isinstance(inputs, (torch.Tensor, np.ndarray)):
        return f"its input is {_what(inputs)}"
    shape, dtype = tuple(inputs.shape), _torch_dtype(inputs)
    floating = dtype is not None and dtype.is_floating_point
    if kind == "points":
        if len(shape) != 2 or shape[1] != 3 or not floating:
            return f"its points are {_what(inputs)}"
    elif not ((dtype == torch.uint8 and len(shape) == 3 and shape[2] == 3) or
              (floating and len(shape) == 3 and shape[0] == 3)):
        return f"its image is {_what(inputs)}"
    if isinstance(label, (torch.Tensor, np.ndarray)) and label.ndim == 0:
        label = label.item()  # a 0-d tensor or array: its number
    if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)):
        return f"its label is {_what(label)} ({label!r}), not an integer"
    if not 0 <= label < num_classes:
        return f"its label is {label}, outside 0..{num_classes - 1} ({num_classes} classes)"
    return None


def _token_problem(ids, seq_len: int, vocab_size: int) -> str | None:
    """What is wrong with one block of token ids, or None."""
    dtype = _torch_dtype(ids) if isinstance(ids, (torch.Tensor, np.ndarray)) else None
    if dtype is None or dtype.is_floating_point or dtype == torch.bool or \
            tuple(ids.shape) != (seq_len + 1,):
        return f"it is {_what(ids)}"
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        return f"it holds id {low if low < 0 else high}, outside 0..{vocab_size - 1} " \
               f"(a vocabulary of {vocab_size})"
    return None


EXPECTED = {"images": "(image, label): a uint8 (H, W, 3) image, or a float (3, H, W) one "
                      "already normalised, and an integer label",
            "points": "(points, label): float points of shape (N, 3) and an integer label",
            "tokens": "a block of data.tokens.seq_len + 1 = {} integer token ids (a 1-D tensor "
                      "or array): the model reads the first seq_len and predicts the last"}


def check_samples(dataset, split: str, reference: str, kind: str, num_classes: int,
                  seq_len: int = 0) -> None:
    """A few samples (first, middle, last; a stream's first three) of `dataset` fit the task,
    or a DataError naming the first bad index, what it holds and what is expected.
    `num_classes`: the vocabulary's size for tokens."""
    for index, sample in _some_samples(dataset, split, reference):
        if kind == "tokens":
            problem = _token_problem(sample, seq_len, num_classes)
        elif not (isinstance(sample, (tuple, list)) and len(sample) == 2):
            problem = f"it is {_what(sample)}, not a pair"
        else:
            problem = _problem(*sample, kind, num_classes)
        if problem:
            raise DataError(f"data.dataset: {reference}: {split} sample {index}: {problem}; "
                            f"expected {EXPECTED[kind].format(seq_len + 1)}")


def _some_samples(dataset, split: str, reference: str):
    """(index, sample) for a few samples; a DataError when the user's code cannot read one."""
    if isinstance(dataset, IterableDataset):
        try:
            yield from enumerate(first_items(dataset, 3, reference))
        except UserError:
            raise
        except Exception as err:  # the user's __iter__
            raise DataError(f"data.dataset: {reference}: the {split} stream cannot be read: "
                            f"{user_code.why(err)}") from None
        return
    for index in sorted({0, len(dataset) // 2, len(dataset) - 1}):
        try:
            sample = dataset[index]
        except Exception as err:  # the user's __getitem__
            raise DataError(f"data.dataset: {reference}: {split} sample {index} cannot be "
                            f"read: {user_code.why(err)}") from None
        yield index, sample
