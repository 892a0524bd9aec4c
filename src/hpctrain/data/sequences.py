"""Variable-length sequences: token ids stored unpadded, batched by length, padded per batch.

Padding every sequence to the longest of the dataset wastes most of a step on short data; random
batches padded to their own longest still waste a third or more. Here a seeded shuffle is cut
into pools of `pool_batches` batches, each pool is sorted by length and cut into batches, and
the batch order is shuffled again: neighbours in a batch have similar lengths (little padding)
while every epoch still mixes the whole dataset. Distributed, each rank takes every
world_size-th batch of the same global list, so the ranks never share a sample and all run the
same number of steps.

Storage (`write_tokens`): one flat `tokens.npy` (int32, all sequences back to back) and an
`index.npy` of (start, length, label), memory-mapped by each worker; both are written under
temporary names and renamed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from hpctrain.errors import DataError

TOKEN_INDEX_DTYPE = np.dtype([("start", "<u8"), ("length", "<u4"), ("label", "<i4")])


def write_tokens(dst: Path, sequences: Iterable[np.ndarray], labels: Iterable[int]) -> int:
    """Store `sequences` (1-D integer arrays) unpadded in `dst`; returns their number."""
    dst.mkdir(parents=True, exist_ok=True)
    parts, records, start = [], [], 0
    for tokens, label in zip(sequences, labels, strict=True):
        tokens = np.asarray(tokens, dtype=np.int32)
        parts.append(tokens)
        records.append((start, len(tokens), label))
        start += len(tokens)
    for name, array in (("tokens.npy", np.concatenate(parts) if parts else
                         np.zeros(0, np.int32)),
                        ("index.npy", np.array(records, dtype=TOKEN_INDEX_DTYPE))):
        partial = dst / f".{name}.partial"
        with open(partial, "wb") as handle:
            np.save(handle, array, allow_pickle=False)
        os.replace(partial, dst / name)
    return len(records)


class TokenDataset(Dataset):
    """(token ids, label) from a folder written by `write_tokens`; maps lazily per worker."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        for name in ("tokens.npy", "index.npy"):
            if not (self.root / name).is_file():
                raise DataError(f"{self.root} holds no token data ({name} is missing); write "
                                "it with hpctrain.data.sequences.write_tokens")
        index = np.load(self.root / "index.npy")
        self.lengths = index["length"].astype(np.int64)
        try:
            stored = len(np.load(self.root / "tokens.npy", mmap_mode="r"))
        except ValueError as err:  # numpy: the file is shorter than its header says
            raise DataError(f"{self.root}/tokens.npy is truncated or damaged ({err}); write "
                            "the token data again") from None
        needed = int((index["start"] + index["length"]).max()) if len(index) else 0
        if needed > stored:
            raise DataError(f"{self.root}/tokens.npy holds {stored} tokens but index.npy "
                            f"points up to {needed}: the two files do not belong together")
        self._tokens = self._index = None

    def __getstate__(self):
        return {**self.__dict__, "_tokens": None, "_index": None}

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, position: int) -> tuple[torch.Tensor, int]:
        if self._tokens is None:
            self._tokens = np.load(self.root / "tokens.npy", mmap_mode="r")
            self._index = np.load(self.root / "index.npy", mmap_mode="r")
        start, length, label = self._index[position]
        tokens = self._tokens[int(start):int(start) + int(length)]
        return torch.from_numpy(np.array(tokens)), int(label)


class LengthBucketSampler(Sampler[list[int]]):
    """Batches of indices of similar length (see the module docstring); a batch sampler."""

    def __init__(self, lengths, batch_size: int, pool_batches: int = 50, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1):
        self.lengths = np.asarray(lengths)
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
        yield from self.batches()[self.start + self.rank::self.world_size]

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
