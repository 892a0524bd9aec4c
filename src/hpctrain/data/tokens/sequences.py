"""Variable-length sequences (a token pack's documents, token_pack.py): batched by length, padded
per batch.

Padding every sequence to the longest of the dataset wastes most of a step on short data; random
batches padded to their own longest still waste a third or more. Here a seeded shuffle is cut
into pools of `pool_batches` batches, each pool is sorted by length and cut into batches, and
the batch order is shuffled again: neighbours in a batch have similar lengths (little padding)
while every epoch still mixes the whole dataset. Distributed, each rank takes every
world_size-th batch of the same global list, so the ranks never share a sample and all run the
same number of steps.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Sampler

from hpctrain.data.sampling import SampleKey


class LengthBucketSampler(Sampler[list[int]]):
    """Batches of indices of similar length (see the module docstring); a batch sampler."""

    def __init__(self, lengths, batch_size: int, pool_batches: int = 50, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1, keyed: bool = False):
        self.lengths = np.asarray(lengths)
        self.keyed = keyed  # batches of SampleKeys, for a dataset that reseeds its workers
        self.batch_size, self.pool_batches = batch_size, pool_batches
        self.shuffle, self.seed = shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.start = 0  # batches of the global list already trained (a resumed epoch)

    def set_epoch(self, epoch: int, size: int | None = None, start: int = 0) -> None:
        """Prepare the next pass; `start` counts samples of the global order, as for
        EpochSampler (`size` is an image size, unused here)."""
        self.epoch, self.start = epoch, start // self.batch_size

    def batches(self) -> list[list[int]]:
        """This epoch's batches over all ranks, the same list on every rank; the tail that
        does not fill a batch on every rank is left out."""
        generator = np.random.default_rng(self.seed * 1_000_003 + self.epoch)
        order = generator.permutation(len(self.lengths)) if self.shuffle else \
            np.arange(len(self.lengths))
        pool = self.batch_size * self.pool_batches
        batches = []
        for begin in range(0, len(order), pool):
            chunk = order[begin:begin + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[i:i + self.batch_size].tolist()
                        for i in range(0, len(chunk) - self.batch_size + 1, self.batch_size)]
        if self.shuffle:
            batches = [batches[i] for i in generator.permutation(len(batches))]
        return batches[:len(batches) - len(batches) % self.world_size]

    def __iter__(self):
        for batch in self.batches()[self.start + self.rank::self.world_size]:
            yield [SampleKey(index, self.epoch, 0) for index in batch] if self.keyed else batch

    def __len__(self) -> int:
        return (len(self.batches()) - self.start) // self.world_size

    def padding_fraction(self) -> float:
        """The share of padding tokens this epoch's batches will carry (no data read)."""
        return padding_of(self.lengths, self.batches())


def padding_of(lengths: np.ndarray, batches: list[list[int]]) -> float:
    real = sum(int(lengths[b].sum()) for b in batches)
    padded = sum(int(lengths[b].max()) * len(b) for b in batches)
    return 1 - real / max(padded, 1)


def pad_collate(samples: list[tuple[torch.Tensor, int]], pad_id: int = 0,
                multiple_of: int = 8, shift: int = 0) -> dict[str, torch.Tensor | float]:
    """Pad a batch to its own longest sequence (rounded up to `multiple_of`, which tensor cores
    want): tokens, mask (True on real tokens), lengths, labels and the padding fraction.
    `shift`: a language model's input is all but the last token, so with shift=1 that input,
    the width less one, is the multiple."""
    lengths = torch.tensor([len(tokens) for tokens, _ in samples])
    width = -(-(int(lengths.max()) - shift) // multiple_of) * multiple_of + shift
    tokens = torch.full((len(samples), width), pad_id, dtype=torch.int32)
    for row, (sequence, _) in enumerate(samples):
        tokens[row, :len(sequence)] = sequence
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return {"tokens": tokens, "mask": mask, "lengths": lengths,
            "labels": torch.tensor([label for _, label in samples]),
            "padding_fraction": 1 - float(lengths.sum()) / tokens.numel()}
