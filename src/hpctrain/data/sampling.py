"""Epoch-seeded, resumable sample order.

The sampler yields `SampleKey(index, epoch, size)` rather than a bare index: the dataset, which
lives in worker processes that never hear about epochs, seeds each sample's augmentation from
(seed, epoch, index) and renders it at the epoch's resolution (progressive resizing). So the
same sample gets the same crop whatever the number of workers, and a run resumed mid-epoch
sees exactly the batches the interrupted run would have seen.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.data import Sampler


class SampleKey(NamedTuple):
    index: int
    epoch: int
    size: int


class EpochSampler(Sampler[SampleKey]):
    def __init__(self, num_samples: int, size: int, shuffle: bool, seed: int = 0):
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.size = size
        self.start = 0

    def set_epoch(self, epoch: int, size: int, start: int = 0) -> None:
        """Prepare the next pass: its epoch number, image size and first position."""
        self.epoch, self.size, self.start = epoch, size, start

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self):
        for index in self.order()[self.start:]:
            yield SampleKey(index, self.epoch, self.size)

    def __len__(self) -> int:
        return self.num_samples - self.start
