"""Your DataLoaders, where hpctrain expected Datasets: `hpctrain.fit(model, train_loader,
val_loader)`, a LightningDataModule's (or a LightningModule's own) `train_dataloader` and
`val_dataloader`, a factory returning (train_loader, val_loader).

What a loader sets about its batches is kept (`LoaderSettings`): its batch size, collate
function, order (shuffled, in order, or its own sampler), drop_last and workers (with their
worker_init_fn and start method). hpctrain makes the loaders again around the same
datasets, as Lightning does: its own loader keeps the stop signals from the workers, resumes
mid-epoch at the exact batch and splits the order over processes. Under several processes
a shuffled or ordered loader takes hpctrain's epoch-seeded sampler, each rank every N-th
sample of one order (Lightning's DistributedSampler); a sampler of your own
(WeightedRandomSampler) is drawn for each epoch under a random state seeded by (seed, epoch),
the same on every rank, and each rank takes every N-th index of it (Lightning's
DistributedSamplerWrapper). A batch_sampler of your own (LightningLSTM's SequenceSampler,
whose rows carry a hidden state from batch to batch) makes every batch on one process, its
epoch drawn under the same seeded random state (`OwnBatches`). What only moves batches faster
(pin_memory, persistent_workers, prefetch_factor) stays hpctrain's (`data.*`). What cannot be
kept is refused by name: a sampler or batch sampler without a length, a validation loader
with a sampler of its own, a batch sampler of your own under several processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import (BatchSampler, DataLoader, Dataset, IterableDataset,
                              RandomSampler, Sampler, SequentialSampler, default_collate,
                              default_convert)

from hpctrain.errors import DataError


@dataclass(frozen=True)
class LoaderSettings:
    """What your DataLoader set that hpctrain keeps."""

    batch_size: int
    collate: Callable | None  # None: torch's default collation
    shuffle: bool  # (without a sampler of its own) shuffled, or in order
    sampler: Sampler | None  # a sampler of its own (WeightedRandomSampler), or None
    drop_last: bool
    num_workers: int
    worker_init_fn: Callable | None
    start_method: str | None  # its multiprocessing_context's, or None
    batch_sampler: Sampler | None = None  # a batch sampler of its own: it makes the batches

    def describe(self) -> str:
        order = f"its own {type(self.sampler).__name__}" if self.sampler is not None else \
            f"batches of its own {type(self.batch_sampler).__name__}" \
            if self.batch_sampler is not None else "shuffled" if self.shuffle else "in order"
        collate = f", collate {getattr(self.collate, '__name__', 'its own')}" \
            if self.collate is not None else ""
        return (f"batch {self.batch_size}, {order}, drop_last {self.drop_last}{collate}, "
                f"{self.num_workers} workers")


def is_loader(value) -> bool:
    return isinstance(value, DataLoader)


def own_collate(loader: DataLoader) -> Callable | None:
    """The loader's collate function; None where it is torch's default."""
    collate = loader.collate_fn
    return None if collate in (default_collate, default_convert) else collate


def is_plain(loader: DataLoader) -> bool:
    """Whether the loader's order is plain, shuffled or in order (a stream's too), rather
    than a sampler of its own."""
    sampler = loader.sampler
    return isinstance(loader.dataset, IterableDataset) or type(sampler) is SequentialSampler \
        or (type(sampler) is RandomSampler and not sampler.replacement and
            sampler._num_samples is None)


def like(loader: DataLoader, dataset: Dataset, validation: bool = False) -> DataLoader:
    """A DataLoader of `dataset` set as `loader` is (its order plain: `is_plain`); for
    `validation`, in order and keeping a last smaller batch (every sample counts once)."""
    return DataLoader(dataset, batch_size=loader.batch_size,
                      shuffle=not validation and type(loader.sampler) is RandomSampler,
                      collate_fn=loader.collate_fn,
                      drop_last=not validation and loader.drop_last,
                      num_workers=loader.num_workers, worker_init_fn=loader.worker_init_fn,
                      multiprocessing_context=loader.multiprocessing_context)


def settings_of(loader: DataLoader, what: str, validation: bool = False) -> LoaderSettings:
    """What `loader` sets, or a DataError naming what hpctrain cannot keep (`what`: where it
    came from, "fit(train_data=...)", "MyData.train_dataloader()")."""
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler:
        return _own_batches(loader, what, validation)
    sampler, plain = loader.sampler, is_plain(loader)
    if not plain:
        if validation:
            raise DataError(f"{what}: a validation DataLoader with a sampler of its own "
                            f"({type(sampler).__name__}): evaluation counts every sample once, "
                            "in order; leave its sampler out")
        if not hasattr(sampler, "__len__"):
            raise DataError(f"{what}: its sampler {type(sampler).__name__} has no length, so "
                            "an epoch has no end: give it __len__")
    context = loader.multiprocessing_context
    return LoaderSettings(
        batch_size=loader.batch_size, collate=own_collate(loader),
        shuffle=type(sampler) is RandomSampler, sampler=None if plain else sampler,
        drop_last=loader.drop_last, num_workers=loader.num_workers,
        worker_init_fn=loader.worker_init_fn,
        start_method=context.get_start_method() if context is not None else None)


def _own_batches(loader: DataLoader, what: str, validation: bool) -> LoaderSettings:
    """The settings of a loader whose batch sampler makes the batches (its batch size: its
    first batch's), or a DataError naming why it cannot be kept."""
    batches = loader.batch_sampler
    name = type(batches).__name__ if batches is not None else "batch_size=None"
    if batches is None or validation or not hasattr(batches, "__len__"):
        why = ("it makes no batches: give it a batch_size" if batches is None else
               "evaluation counts every sample once in order: leave its batch_sampler out"
               if validation else "it has no length, so an epoch has no end: give it __len__")
        raise DataError(f"{what}: a DataLoader with a batch_sampler of its own ({name}): {why}")
    first = next(iter(batches), None)
    if not first:
        raise DataError(f"{what}: its batch_sampler {name} makes no batch")
    context = loader.multiprocessing_context
    return LoaderSettings(
        batch_size=len(first), collate=own_collate(loader), shuffle=False, sampler=None,
        drop_last=False, num_workers=loader.num_workers, worker_init_fn=loader.worker_init_fn,
        start_method=context.get_start_method() if context is not None else None,
        batch_sampler=batches)


class OwnBatches(Sampler[list]):
    """Your batch sampler's batches, each epoch drawn under a random state seeded by (seed,
    epoch) (the same on a resume), after the `start` samples trained (in batches of
    `batch_size`, the engine's count) are left out. One process: its batches cannot be
    split."""

    def __init__(self, batches: Sampler, seed: int, batch_size: int):
        self.batches, self.seed, self.batch_size = batches, seed, batch_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, size: int = 0, start: int = 0) -> None:
        self.epoch, self.start = epoch, start
        if hasattr(self.batches, "set_epoch"):
            self.batches.set_epoch(epoch)

    def __iter__(self):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + self.epoch)
            epoch = [list(batch) for batch in self.batches]
        yield from epoch[self.start // self.batch_size:]

    def __len__(self) -> int:
        return len(self.batches) - self.start // self.batch_size


class SharedSampler(Sampler[int]):
    """Your own sampler, drawn for each epoch under a random state seeded by (seed, epoch)
    (the same draw on every rank and on a resume), each rank taking every world_size-th
    index of it; the tail that does not divide among the ranks is left out, as for
    hpctrain's own sampler."""

    def __init__(self, sampler: Sampler, seed: int, rank: int = 0, world_size: int = 1):
        self.sampler, self.seed = sampler, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, size: int = 0, start: int = 0) -> None:
        """As EpochSampler's: `start` samples of the global order were trained."""
        self.epoch, self.start = epoch, start
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def order(self) -> list[int]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + self.epoch)
            order = [int(index) for index in self.sampler]
        return order[:len(order) - len(order) % self.world_size]

    def __iter__(self):
        yield from self.order()[self.start + self.rank::self.world_size]

    def __len__(self) -> int:
        return len(self.sampler) // self.world_size - self.start // self.world_size


def kept_notes(train: LoaderSettings | None, val: LoaderSettings | None, batch_size: int,
               val_batch: int, world_size: int) -> tuple[str, ...]:
    """What the banner says of your DataLoaders: what was kept, what a setting you told
    hpctrain replaced, and how the order is split over processes."""
    if train is None and val is None:
        return ()
    notes = [f"your DataLoaders kept: training {train.describe() if train else 'none'}; "
             f"validation {val.describe() if val else 'none'}"]
    for what, given, used, key in (("training", train, batch_size, "train.batch_size"),
                                   ("validation", val, val_batch, "data.val_batch_size")):
        if given is not None and given.batch_size != used:
            notes.append(f"{key} {used} (as you set it) replaces your {what} DataLoader's "
                         f"batch size {given.batch_size}")
    if world_size > 1 and train is not None and train.batch_sampler is None:
        notes.append(
            f"your {type(train.sampler).__name__} drawn once an epoch (seeded by seed and "
            f"epoch), each of {world_size} processes taking one index in {world_size} "
            "(as Lightning's DistributedSamplerWrapper)" if train.sampler is not None else
            f"your DataLoader's order split over {world_size} processes: each takes one "
            f"sample in {world_size} of one epoch-seeded order (as Lightning's "
            "DistributedSampler)")
    return tuple(notes)
