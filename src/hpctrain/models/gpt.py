"""A GPT-style decoder for language modelling, in named sizes.

Pre-norm blocks (LayerNorm, then causal self-attention or the MLP, each added back to the
residual stream), rotary position embeddings (no learned position table, so the context is a
setting, not a weight shape), `F.scaled_dot_product_attention` (flash or memory-efficient
kernels on GPUs), and the output layer tied to the token embedding. Written here rather than
taken from `transformers` because the later parallelisms (tensor, pipeline) need a model whose
blocks are plain modules, and tests need one that builds in milliseconds.

Sizes (`hpctrain:gpt_<size>`; parameters with the byte-level vocabulary, then with GPT-2's
50,304): gpt_tiny 0.43 M (the tiny-lm recipe), gpt_mini 0.83 M, gpt_small 10.8 M / 29.9 M,
gpt_124m 85 M / 124 M, gpt_350m 302 M / 353 M, gpt_760m 680 M / 757 M, gpt_1b 1.2 B / 1.3 B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from hpctrain.models.casting import cast_once


@dataclass(frozen=True)
class GPTShape:
    layers: int
    width: int
    heads: int
    context: int  # the longest sequence the model takes

    def __post_init__(self):
        for side in ("layers", "width", "heads", "context"):
            value = getattr(self, side)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{side} {value!r} is not a whole number of at least 1")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


SIZES = {
    "tiny": GPTShape(layers=2, width=128, heads=4, context=128),
    "mini": GPTShape(layers=4, width=128, heads=4, context=256),
    "small": GPTShape(layers=6, width=384, heads=6, context=512),
    "124m": GPTShape(layers=12, width=768, heads=12, context=1024),
    "350m": GPTShape(layers=24, width=1024, heads=16, context=1024),
    "760m": GPTShape(layers=24, width=1536, heads=16, context=2048),
    "1b": GPTShape(layers=24, width=2048, heads=16, context=2048),
}


def rotary_tables(context: int, head_dim: int, base: float = 10000.0):
    """cos and sin of every position's rotation angles, (context, head_dim / 2) each."""
    inverse = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(context, dtype=torch.float32), inverse)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (batch, time, heads, head_dim): rotate each pair of halves."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    cos, sin = (table[:x.shape[1], None].to(x.dtype) for table in (cos, sin))
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class SelfAttention(nn.Module):
    """Causal self-attention. Queries, keys and values are three projections rather than one
    fused one, so that a column-wise split over tensor-parallel ranks gives each rank whole
    heads; the shapes below are read from the tensors (`-1`), which then hold only this
    rank's heads."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        self.head_dim = shape.head_dim
        self.q = nn.Linear(shape.width, shape.width, bias=False)
        self.k = nn.Linear(shape.width, shape.width, bias=False)
        self.v = nn.Linear(shape.width, shape.width, bias=False)
        self.out = nn.Linear(shape.width, shape.width, bias=False)
        cos, sin = rotary_tables(shape.context, shape.head_dim)
        # not in the state dict: derived from the shape, and the same at any precision. Each
        # block holds its own, so that a block is a whole stage of computation (pipelines)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time = x.shape[:2]
        x = cast_once(x)
        q, k, v = (proj(x).view(batch, time, -1, self.head_dim)
                   for proj in (self.q, self.k, self.v))
        # rotated as (batch, time, heads, head_dim): the attention kernels lay their output
        # out like the query, so going back to (batch, time, width) is a view, not a copy
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, time, -1))


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, shape: GPTShape):
        super().__init__()
        self.norm1 = nn.LayerNorm(shape.width)
        self.attention = SelfAttention(shape)
        self.norm2 = nn.LayerNorm(shape.width)
        self.mlp = MLP(shape.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """tokens (batch, time) int -> logits (batch, time, vocab_size)."""

    def __init__(self, vocab_size: int, shape: GPTShape):
        super().__init__()
        if shape.width % shape.heads or shape.head_dim % 2:
            raise ValueError(f"width {shape.width} must split into {shape.heads} heads of an "
                             "even size")
        self.vocab_size, self.shape = vocab_size, shape
        self.embed = nn.Embedding(vocab_size, shape.width)
        # a dict keyed by layer number: a pipeline stage keeps its own layers under their
        # names (blocks.7.mlp.up on any stage), which checkpoints and resharding rely on
        self.blocks = nn.ModuleDict({str(i): Block(shape) for i in range(shape.layers)})
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.apply(self._init)
        for block in self.blocks.values():  # GPT-2's scaling of the residual projections
            for layer in (block.attention.out, block.mlp.down):
                nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * shape.layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def context(self) -> int:
        return self.shape.context

    def attention_shape(self) -> tuple[int, int, int]:
        """(layers, heads, head dimension), for the model FLOPs (train/hardware/mfu.py)."""
        return self.shape.layers, self.shape.heads, self.shape.head_dim

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """A pipeline stage lacks the parts other stages hold (None): the first takes token
        ids, the others the residual stream; the last returns logits, the others the
        stream."""
        x = self.embed(tokens) if self.embed is not None else tokens
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x)) if self.head is not None else x


VOCAB_MULTIPLE = 64  # matrix sizes that are multiples of 64 run on full Tensor Core tiles


def gpt(size: str, vocab_size: int = 50304, **shape_changes) -> GPT:
    """`gpt("124m", vocab_size=...)`; `shape_changes` (layers, width, heads, context) adjust
    the named size. The vocabulary is padded to a multiple of 64 (nanoGPT's 50,257 -> 50,304:
    the extra rows are never a target, and the output layer runs faster)."""
    padded = -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    return GPT(padded, replace(SIZES[size], **shape_changes))


def named_sizes() -> dict:
    """hpctrain:gpt_<size> -> its factory, for the model registry."""
    return {f"gpt_{size}": (lambda size: lambda vocab_size=50304, **kw: gpt(size, vocab_size,
                                                                           **kw))(size)
            for size in SIZES}
