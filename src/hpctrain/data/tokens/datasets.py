"""A token pack's samples and loaders: blocks of one stream (sampled like any dataset's), or
documents batched by length and padded per batch."""

from __future__ import annotations

import functools
from pathlib import Path

from torch.utils.data import Dataset

from hpctrain.data.sampling import EpochSampler
from hpctrain.data.tokens.arithmetic import ANSWER_START, ensure_arithmetic
from hpctrain.data.tokens.sequences import (MULTIPLE, LengthBucketSampler, bucket_widths,
                                             padding_of)
from hpctrain.data.tokens.token_pack import (TokenBlocks, TokenDocuments, TokenPack,
                                             pad_documents)
from hpctrain.data.worker_signals import SignalSafeLoader
from hpctrain.errors import DataError


def token_pack_of(data) -> TokenPack:
    """The token pack the recipe reads: data.path, or the built-in corpus (made on first use)."""
    if data.dataset == "arithmetic":
        a = data.arithmetic
        return TokenPack(ensure_arithmetic(Path(a.cache_dir).expanduser(), a.seed, a.num_train,
                                           a.num_val, a.max_operand, a.operations))
    return TokenPack(data.path)


def token_datasets(data) -> tuple[Dataset, Dataset, TokenPack]:
    pack = token_pack_of(data)
    seq_len = data.tokens.seq_len
    if data.tokens.batching == "blocks":
        return (TokenBlocks(pack.split("train"), seq_len), TokenBlocks(pack.split("val"),
                                                                       seq_len), pack)
    return (TokenDocuments(pack.split("train"), seq_len, pack.eos_id),
            TokenDocuments(pack.split("val"), seq_len, pack.eos_id), pack)


def token_loaders(data, batch_size: int, seed: int, rank: int, world_size: int,
                  common: dict):
    """Blocks of a token stream (sampled like images), or documents batched by length."""
    from hpctrain.data.loader import DataBundle, sample_loader, val_batch_size

    train_set, val_set, pack = token_datasets(data)
    shard = dict(rank=rank, world_size=world_size)
    documents = data.tokens.batching == "documents"
    collate, notes = None, ()
    if documents:
        train_sampler = LengthBucketSampler(train_set.lengths, batch_size,
                                            data.tokens.bucket_pool_batches, seed=seed, **shard)
        collate, notes = _padded_to_buckets(data, train_set, train_sampler)
        train_loader = SignalSafeLoader(train_set, batch_sampler=train_sampler,
                                        collate_fn=collate, **common)
    else:
        train_sampler = EpochSampler(len(train_set), 0, shuffle=True, seed=seed, **shard)
        train_loader = sample_loader(data, train_set, train_sampler, batch_size, True, 0,
                                     common, between_passes=True)
    if len(train_loader) == 0:
        raise DataError(f"the training split of {pack.root} makes {len(train_set)} samples of "
                        f"data.tokens.seq_len={data.tokens.seq_len}, fewer than one batch "
                        f"(train.batch_size={batch_size} x {world_size} processes); lower the "
                        "batch size or the sequence length")
    val_sampler = EpochSampler(len(val_set), 0, shuffle=False, pad=True, **shard)
    val_loader = sample_loader(data, val_set, val_sampler, val_batch_size(data, batch_size),
                               False, 0, {**common, "collate_fn": collate}, between_passes=False)
    answer = None
    if data.dataset == "arithmetic":
        answer = (ord(ANSWER_START), pack.eos_id)
    return DataBundle(train_loader, train_sampler, val_loader, val_sampler, None,
                      common["num_workers"], pack.vocab_size, answer,
                      **({"collate": collate} if collate else {}), notes=notes)


def _padded_to_buckets(data, documents: TokenDocuments, sampler: LengthBucketSampler):
    """(the documents' collate, the banner's words for it): each batch padded up to one of
    data.tokens.width_buckets widths, chosen from the first epoch's batches, or to its own
    longest."""
    batches, count = sampler.batches(), data.tokens.width_buckets
    own = padding_of(documents.lengths, batches, multiple_of=MULTIPLE, shift=1)
    if not count:
        return pad_documents, (f"documents padded per batch to its longest, rounded up to "
                               f"{MULTIPLE}: {own:.1%} of the positions padding",)
    widths = bucket_widths(documents.lengths, batches, count, shift=1)
    padded = padding_of(documents.lengths, batches, widths, multiple_of=MULTIPLE, shift=1)
    return functools.partial(pad_documents, widths=widths), (
        f"documents padded to {len(widths)} widths ({', '.join(map(str, widths))}; "
        f"data.tokens.width_buckets): {padded:.1%} of the positions padding (each batch to "
        f"its longest, rounded up to {MULTIPLE}: {own:.1%})",)
