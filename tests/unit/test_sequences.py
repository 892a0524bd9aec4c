"""Variable-length sequences: length-bucketed batches (also split over ranks), dynamic padding
and its reported fraction, a token pack's documents through DataLoader workers.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_sequences.py."""


import numpy as np
import pytest
import torch

from hpctrain.data.tokens.sequences import (LengthBucketSampler, bucket_widths, pad_collate,
                                            padding_of)


@pytest.fixture
def lengths():
    return np.random.default_rng(0).integers(5, 500, size=2000)


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


def test_batches_padded_to_a_few_widths_take_only_those_widths(lengths):
    """data.tokens.width_buckets: every batch of an epoch, any epoch, is padded to one of at
    most 8 widths (what a compiled model then sees), the largest holding any sample, for a
    little more padding than each batch to its own longest."""
    sampler = LengthBucketSampler(lengths, batch_size=32, seed=1)
    widths = bucket_widths(lengths, sampler.batches(), 8, shift=1)
    assert len(widths) == 8 and widths[-1] == 505 and all((w - 1) % 8 == 0 for w in widths)
    made = set()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch in sampler:
            samples = [(torch.ones(int(lengths[i]), dtype=torch.int32), 0) for i in batch]
            made.add(pad_collate(samples, shift=1, widths=widths)["tokens"].shape[1])
    assert made <= set(widths) and len(made) > 1
    sampler.set_epoch(0)  # the batches the widths were chosen from: 4.1 % -> 12.1 % padding
    own = padding_of(lengths, sampler.batches(), shift=1, multiple_of=8)
    assert own < padding_of(lengths, sampler.batches(), widths, 8, 1) < own + 0.1
    assert bucket_widths(lengths, sampler.batches(), 0) == ()


def test_without_drop_last_one_process_keeps_the_epoch_s_last_smaller_batch():
    """Your DataLoader's drop_last=False (Hugging Face's default, with group_by_length) kept
    under data.bucketing: before, the banner said it was kept while the sampler left the last
    4 of 300 samples out of every epoch."""
    lengths = np.arange(300) % 37 + 1
    kept = LengthBucketSampler(lengths, batch_size=8, seed=1, drop_last=False)
    dropped = LengthBucketSampler(lengths, batch_size=8, seed=1)
    assert (len(kept), len(dropped)) == (38, 37)
    assert sorted(i for batch in kept for i in batch) == list(range(300))
    assert sorted(len(batch) for batch in kept)[0] == 4
    ranks = LengthBucketSampler(lengths, batch_size=8, seed=1, world_size=2, drop_last=False)
    assert all(len(batch) == 8 for batch in ranks)  # every rank steps alike
