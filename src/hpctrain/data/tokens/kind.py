"""Tokens: the data kind of language modelling. Its settings (how a pack becomes samples,
the built-in arithmetic corpus) and its datasets and loaders (data/tokens/datasets.py) are
asked through `SPEC`."""

from __future__ import annotations

from hpctrain.data.kind import DataKind, moving_batcher, own_check, three_quarters
from hpctrain.data.tokens.settings import ArithmeticConfig, TokensConfig

ASSUMED_VOCABULARY = 50304  # GPT-2's, padded: what memory assumes of a pack it cannot read


def _datasets_of(data, seed: int, rank: int, scratch):
    """(train, val, vocabulary) of a pack or the built-in corpus."""
    from hpctrain.data.tokens.datasets import token_datasets

    train, val, pack = token_datasets(data)
    return train, val, pack.vocab_size


def _loaders(data, batch_size: int, seed: int, rank: int, world_size: int, common: dict):
    if data.from_user_code:
        return None  # your own blocks of ids: sampled and stacked like any dataset's
    from hpctrain.data.tokens.datasets import token_loaders

    return token_loaders(data, batch_size, seed, rank, world_size, common)


def _collate(data):
    """Documents are padded per batch; blocks stacked."""
    if data.tokens.batching != "documents":
        return None
    from hpctrain.data.tokens.token_pack import pad_documents

    return pad_documents


def _width(data):
    """The vocabulary, from the pack's index (the built-in corpus is byte-level: never
    generated for this)."""
    from hpctrain.data.tokens.token_pack import TokenPack
    from hpctrain.data.tokens.tokenizer import BYTE_EOS
    from hpctrain.errors import UserError

    if data.dataset == "arithmetic":
        return BYTE_EOS + 1, None  # the bytes and an end-of-document id
    try:
        return TokenPack(data.path).vocab_size, None
    except UserError as err:
        return ASSUMED_VOCABULARY, f"vocabulary assumed {ASSUMED_VOCABULARY:,} ({err})"


def _smaller_sample(data, shape: tuple[int, ...]):
    size, lower = shape[-1], three_quarters(shape[-1])
    if lower >= size:
        return None
    return "data.tokens.seq_len", lower, f"{lower / size:.0%} of the tokens per sample"


def _own_data_problem(data) -> str | None:
    if data.tokens.batching != "blocks":
        return (f"data.dataset={data.dataset}: your own token data comes as blocks of "
                "data.tokens.seq_len + 1 ids; data.tokens.batching=documents reads a token "
                "pack's documents: set data.tokens.batching=blocks")
    return None


def _shapes(data) -> str:
    """Blocks: one shape; documents: padded to a few widths (width_buckets), else each batch
    to its longest."""
    if data.from_user_code:
        return "unknown"
    if data.tokens.batching == "blocks":
        return "fixed"
    return "few" if data.tokens.width_buckets > 0 else "varied"


SPEC = DataKind(
    name="tokens", samples_word="token ids",
    model_hint="a language model (hpctrain:gpt_*, hf:PATH)",
    unit=lambda data: data.tokens.batching[:-1], batcher=moving_batcher,
    datasets=("tokens", "arithmetic"), needs_path=("tokens",),
    settings={"tokens": TokensConfig, "arithmetic": ArithmeticConfig},
    vocabulary=True, datasets_of=_datasets_of, loaders=_loaders, collate=_collate,
    shapes=_shapes, fewer_shapes="data.tokens.width_buckets=8 (a few widths, one graph each)",
    sample_shape=lambda data: (data.tokens.seq_len,), width=_width,
    smaller_sample=_smaller_sample, own_data_problem=_own_data_problem,
    own_facts=lambda data: {"seq_len": data.tokens.seq_len},
    own_sample_problem=own_check("token_block_problem"),
    own_expected=lambda data: f"a block of data.tokens.seq_len + 1 = {data.tokens.seq_len + 1} "
                              "integer token ids (a 1-D tensor or array): the model reads the "
                              "first seq_len and predicts the last")
