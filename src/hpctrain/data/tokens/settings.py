"""Tokens' sections of the recipe's data section (`data.tokens`, `data.arithmetic`), apart
from their spec (kind.py) so that the datasets can name them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpctrain.data.kind import MOST_SAMPLES
from hpctrain.sections import Section


class TokensConfig(Section):
    """Language-model data: how a token pack becomes samples."""

    seq_len: int = Field(256, ge=2, description="tokens a sample feeds the model (its "
                         "context length in training)")
    batching: Literal["blocks", "documents"] = Field(
        "blocks", description="blocks: the corpus as one stream cut into seq_len blocks (no "
        "padding); documents: one sample per document, batched by length and padded per batch")
    bucket_pool_batches: int = Field(50, ge=1, description="documents: batches sorted by "
                                     "length together (more: less padding, less randomness)")
    width_buckets: int = Field(0, ge=0, le=64, description="documents: pad batches up to at "
                               "most this many widths (those that pad the first epoch least), "
                               "each compiled as a static graph of its own (CUDA graphs, "
                               "per-shape kernels); 0: each batch to its own longest, rounded "
                               "up to 8 (compiled with symbolic sizes once a width changes)")
    vocab_size: int | None = Field(None, ge=2, description="your own token data: its "
                                   "vocabulary (None: the training dataset's vocab_size)")


class ArithmeticConfig(Section):
    """The built-in corpus of sums and differences (data.dataset=arithmetic)."""

    num_train: int = Field(200_000, ge=10, le=MOST_SAMPLES, description="training documents "
                           "(problems, drawn with repeats from those not held out)")
    num_val: int = Field(2000, ge=10, le=MOST_SAMPLES, description="distinct held-out problems")
    max_operand: int = Field(99, ge=2, le=999, description="every problem up to it is "
                             "written out once: 999 makes 1 M per operation")
    operations: str = Field("+-", pattern=r"^[+*-]+$", description="the operations the "
                            "problems use, among + - *")
    seed: int = Field(0, description="the generator's seed: which problems are held out, "
                      "and the training draw")
    cache_dir: str = Field("~/.cache/hpctrain",
                           description="where the generated corpus is kept between runs")
