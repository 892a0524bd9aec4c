"""Evaluation with each batch-norm folded into the convolution before it (train.fuse_eval).

In evaluation a BatchNorm2d is a fixed per-channel scale and shift, so conv -> BN is one
convolution with scaled weights and a bias: one kernel and one pass over the activations
fewer per pair (53 of them in a ResNet-50). The model is traced once with torch.fx; the traced
copy shares every module with the live model except the folded convolutions, whose weights
are recomputed from the live convolution and batch-norm before each evaluation. A ReLU after a
pair stays as it is: it is one elementwise pass, run in place by torchvision's models, and fused
into the convolution's output by torch.compile where compile is on.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.nn.utils.fusion import fuse_conv_bn_weights

from hpctrain.train.compilation import replayed


class FusedEvaluation:
    """The traced model with its conv -> BN pairs folded; `module()` refreshes and gives it."""

    def __init__(self, traced: fx.GraphModule, pairs: list, live: nn.Module,
                 sync_buffers: bool, compile_mode: str | None):
        self.traced, self.pairs, self.live, self.sync_buffers = traced, pairs, live, sync_buffers
        self.forward = replayed(torch.compile(traced, mode=compile_mode), compile_mode) \
            if compile_mode else traced

    def describe(self) -> str:
        return f"{len(self.pairs)} conv + batch-norm pairs folded for evaluation"

    @torch.no_grad()
    def module(self) -> nn.Module:
        """The folded model with the live weights and statistics of this moment. Under DDP
        rank 0's buffers are broadcast first, as DDP's own forward would."""
        if self.sync_buffers:
            for buffer in self.live.buffers():
                dist.broadcast(buffer, src=0)
        for folded, conv, bn in self.pairs:
            weight, bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean,
                                                bn.running_var, bn.eps, bn.weight, bn.bias)
            folded.weight.copy_(weight)
            folded.bias.copy_(bias)
        return self.forward


def fold(model: nn.Module, sync_buffers: bool = False,
         compile_mode: str | None = None) -> FusedEvaluation | str:
    """The folded evaluation of `model`, or why there is none (a reason to tell the user)."""
    if not any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
        return "the model has no BatchNorm2d to fold"
    try:
        traced = fx.symbolic_trace(model)
    except Exception as err:  # data-dependent control flow, untraceable calls
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"torch.fx cannot trace the model ({first[:160]})"
    modules = dict(traced.named_modules())
    pairs = []
    for node in list(traced.graph.nodes):
        bn = modules.get(node.target) if node.op == "call_module" else None
        if not isinstance(bn, nn.BatchNorm2d) or not bn.track_running_stats:
            continue
        source = node.args[0]
        conv = modules.get(source.target) if isinstance(source, fx.Node) and \
            source.op == "call_module" else None
        if type(conv) is not nn.Conv2d or len(source.users) > 1:
            continue
        folded = copy.deepcopy(conv).requires_grad_(False)
        if folded.bias is None:
            folded.bias = nn.Parameter(conv.weight.new_zeros(conv.out_channels),
                                       requires_grad=False)
        name = f"folded_{len(pairs)}"
        traced.add_submodule(name, folded)
        source.target = name
        node.replace_all_uses_with(source)
        traced.graph.erase_node(node)
        pairs.append((folded, conv, bn))
    if not pairs:
        return "no batch-norm follows a convolution directly"
    traced.graph.lint()
    traced.recompile()
    traced.delete_all_unused_submodules()
    return FusedEvaluation(traced, pairs, model, sync_buffers, compile_mode)
