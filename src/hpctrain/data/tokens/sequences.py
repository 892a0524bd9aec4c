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

MULTIPLE = 8  # padded widths are multiples of it (the model's input length): tensor cores' size


class LengthBucketSampler(Sampler[list[int]]):
    """Batches of indices of similar length (see the module docstring); a batch sampler."""

    def __init__(self, lengths, batch_size: int, pool_batches: int = 50, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1, keyed: bool = False,
                 drop_last: bool = True):
        self.lengths = np.asarray(lengths)
        # False: the epoch's last samples make a smaller batch, as your DataLoader's
        # drop_last=False (Hugging Face's default) does, where one process trains
        self.drop_last = drop_last or world_size > 1
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
        does not fill a batch on every rank is left out (on one process without drop_last, a
        last smaller batch of it is kept)."""
        generator = np.random.default_rng(self.seed * 1_000_003 + self.epoch)
        order = generator.permutation(len(self.lengths)) if self.shuffle else \
            np.arange(len(self.lengths))
        pool = self.batch_size * self.pool_batches
        batches = []
        for begin in range(0, len(order), pool):
            chunk = order[begin:begin + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            whole = len(chunk) - self.batch_size + 1 if self.drop_last else len(chunk)
            batches += [chunk[i:i + self.batch_size].tolist()
                        for i in range(0, whole, self.batch_size)]
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


def padding_of(lengths: np.ndarray, batches: list[list[int]], widths: tuple[int, ...] = (),
               multiple_of: int = 1, shift: int = 0) -> float:
    """The share of padding in `batches`, each padded to its longest (rounded as
    pad_collate rounds), or up to the first of `widths` that holds it."""
    real = sum(int(lengths[b].sum()) for b in batches)
    padded = sum(bucketed(rounded(int(lengths[b].max()), multiple_of, shift), widths) * len(b)
                 for b in batches)
    return 1 - real / max(padded, 1)


def bucket_widths(lengths: np.ndarray, batches: list[list[int]], count: int,
                  multiple_of: int = MULTIPLE, shift: int = 0) -> tuple[int, ...]:
    """At most `count` widths batches are padded up to, so that a compiled model sees at most
    `count` shapes: those that pad `batches` least (each batch's longest rounded as
    pad_collate rounds it, then grouped into `count` runs by dynamic programming over the
    distinct widths, each run padded to its widest), the largest holding every sample."""
    if count < 1 or not batches:
        return ()
    samples: dict[int, int] = {}  # a batch's rounded width -> samples in such batches
    for batch in batches:
        width = rounded(int(lengths[batch].max()), multiple_of, shift)
        samples[width] = samples.get(width, 0) + len(batch)
    samples.setdefault(rounded(int(np.max(lengths)), multiple_of, shift), 0)
    widths = sorted(samples)
    before = np.cumsum([0] + [samples[w] for w in widths])  # samples up to each width
    # best[k][j]: the least padded size of the first j widths in k runs; came[k][j]: where
    # its last run began
    best = np.full((count + 1, len(widths) + 1), np.inf)
    came = np.zeros((count + 1, len(widths) + 1), dtype=int)
    best[0][0] = 0.0
    for k in range(1, count + 1):
        for j in range(1, len(widths) + 1):  # the last run: widths i..j-1, padded to j-1's
            costs = best[k - 1][:j] + widths[j - 1] * (before[j] - before[:j])
            came[k][j] = int(np.argmin(costs))
            best[k][j] = costs[came[k][j]]
    runs = int(np.argmin(best[1:, len(widths)])) + 1
    chosen, j = [], len(widths)
    for k in range(runs, 0, -1):
        chosen.append(widths[j - 1])
        j = came[k][j]
    return tuple(sorted(chosen))


def rounded(width: int, multiple_of: int = MULTIPLE, shift: int = 0) -> int:
    """`width` rounded up so that the model's input (the width less `shift`) is a multiple
    of `multiple_of`."""
    return -(-(width - shift) // multiple_of) * multiple_of + shift


def bucketed(width: int, widths: tuple[int, ...]) -> int:
    """The first of `widths` that holds `width`; `width` itself where none does (or none
    are given)."""
    return next((w for w in widths if w >= width), width)


def pad_collate(samples: list[tuple[torch.Tensor, int]], pad_id: int = 0,
                multiple_of: int = MULTIPLE, shift: int = 0,
                widths: tuple[int, ...] = ()) -> dict[str, torch.Tensor | float]:
    """Pad a batch to its own longest sequence (rounded up to `multiple_of`, which tensor cores
    want; then up to the first of `widths` that holds it): tokens, mask (True on real
    tokens), lengths, labels and the padding fraction. `shift`: a language model's input is
    all but the last token, so with shift=1 that input, the width less one, is the
    multiple."""
    lengths = torch.tensor([len(tokens) for tokens, _ in samples])
    width = bucketed(rounded(int(lengths.max()), multiple_of, shift), widths)
    tokens = torch.full((len(samples), width), pad_id, dtype=torch.int32)
    for row, (sequence, _) in enumerate(samples):
        tokens[row, :len(sequence)] = sequence
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return {"tokens": tokens, "mask": mask, "lengths": lengths,
            "labels": torch.tensor([label for _, label in samples]),
            "padding_fraction": 1 - float(lengths.sum()) / tokens.numel()}
