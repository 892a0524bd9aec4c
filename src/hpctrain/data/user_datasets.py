"""Your own datasets: `data.dataset: package.module:make` or `path/to/file.py:make`.

The factory returns the training and validation `torch.utils.data.Dataset`s, as a pair or as
{"train": ..., "val": ...}, or their DataLoaders, or a LightningDataModule (whose loaders'
batch size, collate, order, drop_last and workers are kept: given_loaders.py);
`data.kwargs` are passed to it, and so are the facts it names as
parameters: `path` (data.path), `image_size`, `seed` and the data kinds' own (`num_points`,
`seq_len`). `data` is the recipe's data section (settings.DataConfig, not imported here: the
kinds' specs that it is made of ask this module's sample checks). The training
set may also be a stream (an IterableDataset, streams.py). Map-style datasets take
hpctrain's sampler (an epoch-seeded order, split over ranks, resumed mid-epoch at the exact
batch). Randomness inside your `__getitem__` (`random`, NumPy, torch) comes from `seed`: in the
training process with data.num_workers=0, else in each worker reseeded at every epoch from
(seed, epoch, rank, worker) (seeding.py). Two runs draw the same augmentations; a run resumed
mid-epoch sees the same samples in the same batches, but not bitwise the same augmentations.

Samples, checked on a few indices before training (the first bad one is named, with what it
holds and what the task expects):
- image classification: (image, label); the image a uint8 (H, W, 3) tensor or array, which
  hpctrain normalises on the device as for its own data (data.images.mean, data.images.std),
  or a float (3, H, W) tensor already normalised, used as it is;
- point-cloud classification: (points, label), the points a float (N, 3) tensor or array;
- language modelling: a block of data.tokens.seq_len + 1 integer token ids (1-D), below the
  vocabulary's size: data.tokens.vocab_size, or the training dataset's `vocab_size`;
- classification and regression of your own tensors: (inputs, target), the inputs a tensor
  or array of any shape or a tuple or dict of them, the target an integer label or a number
  or float tensor (tasks/tensors.py);
- a LightningModule: anything its training_step takes, not checked here (its step is the
  judge).
The label is an integer below the number of classes: `data.num_classes`, or the dataset's
`classes` (a list) or `num_classes` (images and your own tensors: else your own model's
output width, read by train/build.py).
"""

from __future__ import annotations

from collections.abc import Sized

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from hpctrain import user_code
from hpctrain.data.batching import batched_rows, yours
from hpctrain.data.given_loaders import LoaderSettings, is_loader, settings_of
from hpctrain.data.streams import first_items
from hpctrain.errors import DataError, UserError
from hpctrain.seeding import seed_worker
from hpctrain.tasks import (classification, image_classification, multilabel, regression,
                           segmentation)
from hpctrain.tasks.lightning import is_data_module


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


_MADE: dict[str, tuple] = {}  # "made": (factory, its arguments, what was made of it)


def made_data(data, seed: int, leader: bool = True) -> tuple[
        Dataset, Dataset, LoaderSettings | None, LoaderSettings | None]:
    """(train, val, and where they came in DataLoaders, what those set) of the factory
    data.dataset names. Made once for the same factory and arguments until `forget_made`
    (a run's end, a verb's end): hpctrain asks for the loaders' settings before it builds
    the data, and a LightningDataModule's prepare_data (on its node's first process,
    `leader`) and setup run once, as under Lightning."""
    reference = data.dataset
    factory = user_code.load(reference, "data.dataset")
    arguments = (reference, seed, repr(sorted(data.kwargs.items())),
                 repr(sorted(data.factory_facts(seed).items())))
    kept = _MADE.get("made")
    if kept is None or kept[0] is not factory or kept[1] != arguments:
        made = user_code.call_factory(factory, "data.dataset", reference,
                                      data.factory_facts(seed), data.kwargs)
        _MADE["made"] = kept = (factory, arguments, _train_and_val(made, reference, leader),
                                made if is_data_module(made) else None)
    return kept[2]


def data_module_of(data, seed: int):
    """The LightningDataModule data.dataset made (a LightningModule's
    self.trainer.datamodule), or None."""
    made_data(data, seed)
    return _MADE["made"][3]


def forget_made() -> None:
    """The next made_data calls the factory again (its files may have changed since)."""
    _MADE.clear()


def loader_settings(data, seed: int, leader: bool = True) -> tuple[
        LoaderSettings | None, LoaderSettings | None]:
    """What your training and validation DataLoaders set (None: you gave a Dataset);
    `leader`: this process is its node's first (made_data)."""
    return made_data(data, seed, leader)[2:]


def user_datasets(data, seed: int, rank: int = 0) -> tuple[Dataset, Dataset, int]:
    """(train, val, number of classes) from the factory data.dataset names, checked; `rank`:
    the data-parallel rank, which the workers' seeds derive from."""
    reference = data.dataset
    kind = data.kind_spec
    train, val, *settings = made_data(data, seed)
    collates = [yours(data, given) for given in settings]  # yours, or None
    # a few samples of each split, read once (a dataset may count what is drawn from it)
    read = {split: list(_some_samples(dataset, split, reference))
            for split, dataset in (("train", train), ("val", val))}
    if collates[0]:  # the samples are your collate's: the rows of its batch are checked
        read = {split: batched_rows(samples, split, data, collate)
                for (split, samples), collate in zip(read.items(), collates)}
    if kind.vocabulary:
        num_classes = _vocabulary_of(train, data, reference)
    elif data.targets == "any":  # a LightningModule's steps take the samples as they are
        num_classes = None
    else:  # the samples' kinds first: a sample of another task is named as one
        for split, samples in read.items():
            check_samples(samples, split, reference, data, None)
        num_classes = None if data.targets == "values" else data.num_classes or (
            len(read["train"][0][1][1]) if data.targets == "labels" else  # its vector's
            _classes_of(train, reference, required=kind.classes_needed))
    if num_classes is not None:  # then the labels against the classes (tokens: the ids)
        for split, samples in read.items():
            check_samples(samples, split, reference, data, num_classes)
    if not collates[0]:  # samples of one shape, which torch's collation can stack
        for split, samples in read.items():
            batched_rows(samples, split, data, None)
    # a stream is wrapped where the loader is made (streams.py): it needs the layout
    return train if isinstance(train, IterableDataset) else ByIndex(train, seed, rank), \
        ByIndex(val, seed, rank), num_classes


def _train_and_val(made, reference: str, leader: bool) -> tuple[
        Dataset, Dataset, LoaderSettings | None, LoaderSettings | None]:
    """(train, val, their loaders' settings) of what the factory made: two datasets, two
    DataLoaders (what they set kept, given_loaders.py), or a LightningDataModule."""
    if is_data_module(made):
        made = _of_data_module(made, reference, leader)
    if isinstance(made, dict) and set(made) == {"train", "val"}:
        made = (made["train"], made["val"])
    if not (isinstance(made, (tuple, list)) and len(made) == 2):
        raise DataError(f"data.dataset: {reference} returned {_what(made)}; return the "
                        "training and validation datasets (or DataLoaders): (train, val) or "
                        "{'train': ..., 'val': ...}, or a LightningDataModule")
    settings = [settings_of(part, f"data.dataset: {reference}: the {split} DataLoader",
                            validation=split == "val") if is_loader(part) else None
                for split, part in zip(("train", "val"), made)]
    made = [part.dataset if is_loader(part) else part for part in made]
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
    return made[0], made[1], settings[0], settings[1]


def _of_data_module(module, reference: str, leader: bool) -> tuple:
    """The training and validation DataLoaders of a LightningDataModule, after its
    prepare_data() (on the node's first process, `leader`) and setup("fit"), as Lightning's
    Trainer.fit calls them."""
    if leader:
        module.prepare_data()
    module.setup("fit")
    loaders = []
    for hook in ("train_dataloader", "val_dataloader"):
        loader = getattr(module, hook)()
        if not is_loader(loader):
            raise DataError(f"data.dataset: {reference}.{hook}() returned {_what(loader)}, "
                            "not a torch DataLoader (one loader per split)")
        loaders.append(loader)
    return tuple(loaders)


def _classes_of(dataset, reference: str, required: bool = True) -> int | None:
    """The training dataset's classes; None where not `required` (a kind whose models can
    be your own, whose output width says it, train/build.py)."""
    if isinstance(getattr(dataset, "classes", None), (list, tuple)):
        return len(dataset.classes)
    if isinstance(getattr(dataset, "num_classes", None), int):
        return dataset.num_classes
    if not required:
        return None
    raise unknown_classes(reference)


def unknown_classes(reference: str, why: str = "") -> DataError:
    return DataError(f"data.dataset: {reference}: how many classes? The training dataset has "
                     f"no `classes` list or `num_classes`{why}; set data.num_classes=N")


def _vocabulary_of(dataset, data, reference: str) -> int:
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


def _pair_problem(sample) -> str | None:
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
        return f"it is {_what(sample)}, not a pair"
    return None


def tensor_sample_problem(sample, num_classes: int | None, data) -> str | None:
    """What is wrong with one (inputs, target) sample of your own tensors for the task (its
    targets: data.targets), or None."""
    if problem := _pair_problem(sample):
        return problem
    inputs, label = sample
    targets = data.targets
    return _inputs_problem(inputs) or (
        _value_problem(label) if targets == "values" else
        _labels_problem(label, num_classes) if targets == "labels" else
        _mask_problem(label, num_classes) if targets == "mask" else
        _label_problem(label, num_classes))


def _array_sample_problem(sample, num_classes: int | None, fits, what: str) -> str | None:
    """What is wrong with one (array, label) sample whose array `fits`, or None."""
    if problem := _pair_problem(sample):
        return problem
    inputs, label = sample
    if not isinstance(inputs, (torch.Tensor, np.ndarray)):
        return f"its input is {_what(inputs)}"
    if not fits(inputs):
        return f"its {what} {_what(inputs)}"
    return _label_problem(label, num_classes)


def image_sample_problem(sample, num_classes: int | None, data) -> str | None:
    """What is wrong with one (image, label) sample, or None."""
    return _array_sample_problem(sample, num_classes, is_image, "image is")


def cloud_sample_problem(sample, num_classes: int | None, data) -> str | None:
    """What is wrong with one (points, label) sample, or None."""
    def is_cloud(points) -> bool:
        dtype = _torch_dtype(points)
        return points.ndim == 2 and points.shape[1] == 3 and dtype is not None and \
            dtype.is_floating_point
    return _array_sample_problem(sample, num_classes, is_cloud, "points are")


def other_task_hint(sample) -> str:
    """Where an image sample does not fit: the task your sample looks made for, if another."""
    fits = task_of_sample(sample)
    return f"; or set task={fits[0]} ({fits[1]})" \
        if fits and fits[0] != image_classification.SPEC.name else ""


def is_image(inputs) -> bool:
    """A uint8 (H, W, 3) image, or a float (3, H, W) one."""
    if not isinstance(inputs, (torch.Tensor, np.ndarray)):
        return False
    shape, dtype = tuple(inputs.shape), _torch_dtype(inputs)
    return (dtype == torch.uint8 and len(shape) == 3 and shape[2] == 3) or \
        (dtype is not None and dtype.is_floating_point and len(shape) == 3 and shape[0] == 3)


def _label_problem(label, num_classes: int | None) -> str | None:
    if isinstance(label, (torch.Tensor, np.ndarray)) and label.ndim == 0:
        label = label.item()  # a 0-d tensor or array: its number
    if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)):
        return f"its label is {_what(label)} ({label!r}), not an integer"
    if num_classes is None:
        return f"its label is {label}, below 0" if label < 0 else None
    if not 0 <= label < num_classes:
        return f"its label is {label}, outside 0..{num_classes - 1} ({num_classes} classes)"
    return None


def task_of_sample(sample) -> tuple[str, str] | None:
    """The task `task: auto` stands for on your own sample, and why: an image and an integer
    label, image classification; other inputs and an integer label, classification; a
    vector of 0s and 1s, multi-label classification; another integer tensor, a segmentation
    mask; a float number or tensor, regression.
    None where none of these fits (the sample checks then say what is wrong)."""
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2) or \
            _inputs_problem(sample[0]):
        return None
    inputs, target = sample
    if _label_problem(target, None) is None:
        return (image_classification.SPEC.name, "an image and an integer label") \
            if is_image(inputs) else (classification.SPEC.name, "an integer label")
    if _multi_hot(target) and len(target) > 1:
        return multilabel.SPEC.name, f"a multi-hot target of {len(target)} labels"
    if _integer_tensor(target) and target.ndim >= 1:
        return segmentation.SPEC.name, f"an integer mask of shape {tuple(target.shape)}"
    floating = isinstance(target, (float, np.floating)) or (
        isinstance(target, (torch.Tensor, np.ndarray)) and _torch_dtype(target) is not None
        and _torch_dtype(target).is_floating_point)
    return (regression.SPEC.name, "a float target") if floating else None


def _multi_hot(target) -> bool:
    """A 1-D tensor or array of 0s and 1s (bool, integer or float)."""
    if not isinstance(target, (torch.Tensor, np.ndarray)) or _torch_dtype(target) is None \
            or target.ndim != 1 or len(target) == 0:
        return False
    values = torch.as_tensor(target)
    return bool(((values == 0) | (values == 1)).all())


def _labels_problem(target, num_classes: int | None) -> str | None:
    if not _multi_hot(target):
        return f"its target is {_what(target)}, not a multi-hot vector of 0s and 1s"
    if num_classes is not None and len(target) != num_classes:
        return f"its target has {len(target)} labels, where the first training sample's " \
               f"has {num_classes}"
    return None


def _integer_tensor(target) -> bool:
    dtype = _torch_dtype(target) if isinstance(target, (torch.Tensor, np.ndarray)) else None
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex


def _mask_problem(mask, num_classes: int | None) -> str | None:
    """A segmentation mask: an integer tensor or array of a class (or -100, ignored) for
    every element."""
    if not _integer_tensor(mask) or mask.ndim == 0:
        return f"its mask is {_what(mask)}, not an integer tensor of classes"
    values = torch.as_tensor(mask).long()
    wrong = values[(values != -100) & ((values < 0) | (values >= (num_classes or 2**62)))]
    if wrong.numel():
        return f"its mask holds {int(wrong[0])}, outside 0..{num_classes - 1}" \
            if num_classes else f"its mask holds {int(wrong[0])}, below 0 (-100: ignored)"
    return None


def _numeric(value) -> bool:
    dtype = _torch_dtype(value) if isinstance(value, (torch.Tensor, np.ndarray)) else None
    return dtype is not None and dtype != torch.bool and not dtype.is_complex


def _inputs_problem(inputs) -> str | None:
    """Your own tensors' inputs: a numeric tensor or array, or a tuple, list or dict of them."""
    parts = list(inputs.values()) if isinstance(inputs, dict) else \
        list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    if not parts or not all(isinstance(p, (torch.Tensor, np.ndarray)) and
                            _torch_dtype(p) is not None for p in parts):
        return f"its inputs are {_what(inputs)}"
    return None


def _value_problem(target) -> str | None:
    """A regression target: a number, or a numeric tensor or array."""
    if isinstance(target, (bool, np.bool_)) or not (
            isinstance(target, (int, float, np.integer, np.floating)) or _numeric(target)):
        return f"its target is {_what(target)} ({target!r}), not a number or a float tensor"
    return None


def token_block_problem(ids, vocab_size: int | None, data) -> str | None:
    """What is wrong with one block of data.tokens.seq_len + 1 token ids, or None."""
    seq_len = data.tokens.seq_len
    dtype = _torch_dtype(ids) if isinstance(ids, (torch.Tensor, np.ndarray)) else None
    if dtype is None or dtype.is_floating_point or dtype == torch.bool or \
            tuple(ids.shape) != (seq_len + 1,):
        return f"it is {_what(ids)}"
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        return f"it holds id {low if low < 0 else high}, outside 0..{vocab_size - 1} " \
               f"(a vocabulary of {vocab_size})"
    return None


def check_samples(samples: list, split: str, reference: str, data,
                  num_classes: int | None) -> None:
    """The (index, sample) pairs read of a split (_some_samples: first, middle, last; a
    stream's first three) fit the data's kind and task (its `own_sample_problem`), or a
    DataError naming the first bad index, what it holds and what is expected.
    `num_classes`: the vocabulary's size for token ids."""
    kind = data.kind_spec
    for index, sample in samples:
        if problem := kind.own_sample_problem(sample, num_classes, data):
            raise DataError(f"data.dataset: {reference}: {split} sample {index}: {problem}; "
                            f"expected {kind.own_expected(data)}{kind.own_hint(sample)}")


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
