"""Your own iterable datasets (`torch.utils.data.IterableDataset`): streams read in order, with
no index, such as tar shards read front to back or records from a database.

- **Shares.** Every process and every DataLoader worker must read a different share of the
  stream. Call `hpctrain.shard(items)` in your `__iter__` on what is cheap to split, typically
  your list of files, and each worker opens only its own. A stream that does not call it is
  shared out item by item: each worker reads all of it and keeps every n-th item; correct,
  but it reads the stream n times.
- **Epochs.** hpctrain reads the stream pass after pass. Each epoch starts a new pass, and your
  dataset's `set_epoch(epoch)`, when it has one, is called first in every worker, so a
  shuffle can change with the epoch. `len(dataset)` (items in one pass, all processes
  together) sets the epoch's length. Without a length, one epoch is the whole run of
  `train.max_steps` steps (required then). A pass that ends before its epoch does starts again.
- **Resume.** A resumed run starts the epoch it stopped in again and skips, in each worker, the
  items that went into the steps already trained. The result is exact for a stream that yields
  the same items in the same order for the same epoch, and it costs reading those items again.
  A stream that is not repeatable gets other samples, not an error. Each worker's `random`,
  NumPy and torch are seeded from (seed, epoch, rank, worker) as its pass begins
  (seeding.py), so random augmentation in the stream is repeated too.
The validation set stays map-style: evaluation counts every sample once over all processes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from torch.utils.data import IterableDataset, get_worker_info

from hpctrain.errors import DataError
from hpctrain.seeding import seed_worker

_share: tuple[int, int] = (0, 1)  # (index, count) of the worker iterating, set by Stream
_sharded = False  # whether the stream being iterated called shard() itself


def shard(items: Iterable) -> Iterator:
    """This worker's share of `items`: every n-th one over all processes and DataLoader
    workers of the run (all of them outside a run)."""
    global _sharded
    _sharded = True
    index, count = _share
    return itertools.islice(items, index, None, count)


class Stream(IterableDataset):
    """A user's IterableDataset as hpctrain reads it: this rank's share, epoch after epoch,
    resumed by skipping. It stands in for the sampler too (`set_epoch`), and is handed to
    fresh workers every epoch (the loader's workers are not persistent), so that the epoch and
    the skip reach them."""

    def __init__(self, dataset: IterableDataset, reference: str, rank: int, world_size: int,
                 batch_size: int, seed: int = 0):
        self.dataset, self.reference, self.seed = dataset, reference, seed
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.epoch, self.skip_batches = 0, 0
        self.batches_per_epoch = (len(dataset) // (world_size * batch_size)) if \
            hasattr(dataset, "__len__") else None  # per rank; unsized: set_run_length

    def set_run_length(self, batches: int) -> None:
        """An unsized stream: one epoch of `batches` batches per rank (the whole run)."""
        self.batches_per_epoch = batches

    def __len__(self) -> int:  # per rank, in samples: the loader's len() is then in batches
        return (self.batches_per_epoch or 0) * self.batch_size

    def set_epoch(self, epoch: int, size: int | None = None, start: int = 0) -> None:
        """The sampler's interface: `start` samples of the epoch (all ranks) were trained."""
        self.epoch = epoch
        self.skip_batches = start // (self.world_size * self.batch_size)

    def __iter__(self):
        global _share, _sharded
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        index, count = self.rank * workers + worker, self.world_size * workers
        # the loader takes batches from its workers in turn: this worker made these of them
        skip = len(range(worker, self.skip_batches, workers)) * self.batch_size
        if info is not None:  # the skipped items draw too: a resumed epoch draws alike
            seed_worker(self.seed, self.epoch, self.rank, worker)
        while True:  # pass after pass; the loop stops at the epoch's end
            if hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(self.epoch)
            _share, _sharded = (index, count), False
            kept = 0
            for position, item in enumerate(self.dataset):
                if not _sharded and position % count != index:
                    continue  # the stream does not share itself out: share it item by item
                kept += 1
                if skip:
                    skip -= 1
                    continue
                yield item
            if kept == 0:
                raise DataError(f"data.dataset: {self.reference}: a pass over the stream gave "
                                f"worker {index} of {count} (processes x data.num_workers) no "
                                "items; a stream split by hpctrain.shard needs at least as "
                                "many pieces (files) as workers: lower data.num_workers")


def first_items(dataset: IterableDataset, count: int, reference: str) -> list:
    """The first `count` items of the whole stream, read in this process (to check them)."""
    return list(itertools.islice(iter(Stream(dataset, reference, 0, 1, 1)), count))
