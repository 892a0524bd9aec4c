"""Variable-length sequences: unpadded token storage, length-bucketed batches (also split over
ranks), dynamic padding and its reported fraction."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hpctrain.data.sequences import (LengthBucketSampler, TokenDataset, pad_collate,
                                     padding_of, write_tokens)
from hpctrain.errors import DataError


@pytest.fixture
def lengths():
    return np.random.default_rng(0).integers(5, 500, size=2000)


@pytest.fixture
def stored(tmp_path, lengths):
    sequences = [np.arange(n, dtype=np.int32) + i for i, n in enumerate(lengths)]
    write_tokens(tmp_path / "tokens", sequences, [i % 3 for i in range(len(lengths))])
    return tmp_path / "tokens"


def test_sequences_come_back_unpadded_and_exact(stored, lengths):
    dataset = TokenDataset(stored)
    assert len(dataset) == 2000 and dataset.lengths.tolist() == lengths.tolist()
    tokens, label = dataset[7]
    assert tokens.tolist() == list(range(7, 7 + lengths[7])) and label == 1
    assert (stored / "tokens.npy").stat().st_size < 4 * lengths.sum() + 200  # no padding


def test_a_damaged_token_store_is_named(stored):
    data = (stored / "tokens.npy").read_bytes()
    (stored / "tokens.npy").write_bytes(data[:len(data) // 2])
    with pytest.raises(DataError, match="tokens.npy is truncated or damaged"):
        TokenDataset(stored)


def test_bucketed_batches_cover_the_epoch_once_with_little_padding(lengths):
    sampler = LengthBucketSampler(lengths, batch_size=32, seed=1)
    batches = list(sampler)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)) and all(len(b) == 32 for b in batches)
    assert len(flat) == 2000 - 2000 % 32 == 32 * len(sampler)
    random_batches = LengthBucketSampler(lengths, batch_size=32, pool_batches=1, seed=1)
    assert sampler.padding_fraction() < 0.05 < 0.3 < random_batches.padding_fraction()
    sampler.set_epoch(1)
    assert list(sampler) != batches  # a new mix each epoch...
    sampler.set_epoch(0)
    assert list(sampler) == batches  # ...and the same one again for a resumed epoch


def test_ranks_share_the_batches_without_overlap(lengths):
    ranks = [LengthBucketSampler(lengths, batch_size=16, seed=3, rank=r, world_size=3)
             for r in range(3)]
    per_rank = [list(s) for s in ranks]
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == len(ranks[0])
    seen = [i for batches in per_rank for b in batches for i in b]
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(i for b in ranks[0].batches() for i in b)


def test_pad_collate_pads_to_the_batch_and_reports_the_padding():
    samples = [(torch.arange(3, dtype=torch.int32), 0), (torch.arange(10, dtype=torch.int32), 1)]
    batch = pad_collate(samples, pad_id=-1, multiple_of=8)
    assert batch["tokens"].shape == (2, 16) and batch["tokens"][0, 3:].eq(-1).all()
    assert batch["mask"].sum(1).tolist() == [3, 10] and batch["labels"].tolist() == [0, 1]
    assert batch["padding_fraction"] == pytest.approx(1 - 13 / 32)


def test_a_dataloader_with_workers_delivers_every_token(stored, lengths):
    dataset = TokenDataset(stored)
    sampler = LengthBucketSampler(dataset.lengths, batch_size=64, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate, num_workers=2)
    real = [int(batch["mask"].sum()) for batch in loader]
    assert sum(real) == sum(int(lengths[i]) for b in sampler for i in b)
    assert padding_of(dataset.lengths, sampler.batches()) == sampler.padding_fraction()
