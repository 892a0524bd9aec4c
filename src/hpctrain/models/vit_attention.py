"""timm's ViT attention with its query, key and value projections apart.

timm computes q, k and v with one fused matrix whose rows are all the queries, then all the
keys, then all the values. Split column-wise over the ranks of a tensor-parallel group, that
matrix would give the first rank the queries of every head and the second the keys: the split
must give each rank whole heads of all three, which three matrices split alike do. hpctrain
builds every timm model with this module in place of timm's, whatever the layout, so that a
checkpoint names the same parameters (`attn.q.weight` where timm has `attn.qkv.weight`) under
every layout and reshards between them. The three matrices are cut from timm's initialised
fused one: the same seed gives the same model and the same outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import skip_init

from hpctrain.models.casting import cast_once


class SplitQKVAttention(nn.Module):
    """Multi-head self-attention with separate q, k, v projections; each works on however many
    heads its matrices hold (all of them, or a tensor-parallel rank's share)."""

    def __init__(self, fused: nn.Module):
        super().__init__()
        self.num_heads, self.head_dim = fused.num_heads, fused.head_dim
        self.q, self.k, self.v = (_rows(fused.qkv, part, fused.attn_dim) for part in range(3))
        self.q_norm, self.k_norm, self.norm = fused.q_norm, fused.k_norm, fused.norm
        self.gate, self.proj = fused.gate, fused.proj
        self.attn_drop, self.proj_drop = fused.attn_drop, fused.proj_drop

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        x = cast_once(x)  # one copy for the three projections (casting.py)
        q, k, v = (self._heads(proj(x)) for proj in (self.q, self.k, self.v))
        x = F.scaled_dot_product_attention(
            self.q_norm(q), self.k_norm(k), v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.attn_drop.p if self.training else 0.0)
        x = self.norm(x.transpose(1, 2).flatten(2))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(batch, tokens, heads x head_dim) -> (batch, heads, tokens, head_dim)."""
        return t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)


def _rows(fused: nn.Linear, part: int, width: int) -> nn.Linear:
    """The `part`-th third of the fused projection as a Linear of its own."""
    rows = slice(part * width, (part + 1) * width)
    linear = skip_init(nn.Linear, fused.in_features, width, bias=fused.bias is not None,
                       device=fused.weight.device, dtype=fused.weight.dtype)  # draws nothing
    linear.weight = nn.Parameter(fused.weight[rows].detach().clone())
    if fused.bias is not None:
        linear.bias = nn.Parameter(fused.bias[rows].detach().clone())
    return linear


def split_fused_attention(model: nn.Module) -> nn.Module:
    """`model` with every timm Attention replaced in place by a SplitQKVAttention."""
    from timm.layers.attention import Attention

    for name, module in list(model.named_modules()):
        if type(module) is Attention:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, SplitQKVAttention(module))
    return model
