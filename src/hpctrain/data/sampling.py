"""Epoch-seeded, resumable sample order.

The sampler yields `SampleKey(index, epoch, size)` rather than a bare index: the dataset, which
lives in worker processes that never hear about epochs, seeds each sample's augmentation from
(seed, epoch, index) and renders it at the epoch's resolution (progressive resizing). So the
same sample gets the same crop whatever the number of workers, and a run resumed mid-epoch
sees exactly the batches the interrupted run would have seen.

Across processes each rank takes every world_size-th sample of one global order, so the ranks'
batches of a step together hold the very samples one process would take for that step:
N processes with batch b train like one process with batch N x b. Training drops the tail
that does not divide among the ranks; evaluation pads it with repeats instead, so that every
rank runs the same number of batches (FSDP's collectives need that), and `real_count` tells
which of a rank's samples are not repeats.
"""

from __future__ import annotations

import torch
from torch.utils.data import Sampler

from hpctrain.data.kind import SampleKey


class EpochSampler(Sampler[SampleKey]):
    def __init__(self, num_samples: int, size: int, shuffle: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1, pad: bool = False):
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.epoch = 0
        self.size = size
        self.start = 0

    def set_epoch(self, epoch: int, size: int, start: int = 0) -> None:
        """Prepare the next pass: its epoch number, image size and first position (counted in
        samples of the global order, a multiple of the world size)."""
        assert start % self.world_size == 0, "resume position must split evenly among ranks"
        self.epoch, self.size, self.start = epoch, size, start

    def order(self) -> list[int]:
        """The global order of this epoch, the same on every rank."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def _even_order(self) -> list[int]:
        order = self.order()
        remainder = len(order) % self.world_size
        if self.pad:
            return order + order[:(self.world_size - remainder) % self.world_size]
        return order[:len(order) - remainder]

    @property
    def real_count(self) -> int:
        """How many of this rank's samples (from the start) are not padding repeats."""
        return len(range(self.rank + self.start, self.num_samples, self.world_size))

    def __iter__(self):
        for index in self._even_order()[self.start + self.rank::self.world_size]:
            yield SampleKey(index, self.epoch, self.size)

    def __len__(self) -> int:
        whole, remainder = divmod(self.num_samples, self.world_size)
        total = whole + (remainder > 0) if self.pad else whole
        return total - self.start // self.world_size
