"""Tensor parallelism: each layer's matrices split over the ranks of a tensor-parallel group,
with PyTorch's DTensor and `parallelize_module`.

Megatron's pairing: the first matrix of a pair is split column-wise (the attention's query, key
and value projections; the MLP's up projection), so each rank computes whole heads or a slice
of the hidden units on its own; the second is split row-wise (the attention's output, the MLP's
down projection) and the ranks' partial results are summed, one all-reduce per pair forward
and one backward. The token embedding is split over the vocabulary and the output layer
column-wise, so their weights, tied in the GPT, are split alike.

With `parallel.loss_parallel` the output layer's logits stay split over the vocabulary
(a DTensor) and the cross-entropy is computed on the shares (torch's `loss_parallel`): the
logits, the largest activation of a language model, are never gathered whole on any rank.

With `parallel.sequence_parallel` the norms and the residual stream between the blocks are
split over the sequence as well: each all-reduce becomes a reduce-scatter plus an all-gather
(the same traffic), and the activations outside the matrix products take 1/tensor the memory.

A plan maps module-name patterns (fnmatch: `blocks.*.mlp.up`) to a style. The built-in GPT
has its own, and so have timm's ViTs (their attention's q, k, v and MLP's first matrix
column-wise, the attention's output and the MLP's second row-wise; the patch embedding, the
class token and the head stay whole on every rank). Any other model takes
`parallel.tensor_plan` of `colwise` and `rowwise` entries, which suits models whose layers read
their shapes from the tensors they get.
"""

from __future__ import annotations

import contextlib
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from torch import nn

from hpctrain.config import Config
from hpctrain.errors import ConfigError
from hpctrain.models.gpt import GPT
from hpctrain.models.vit_attention import SplitQKVAttention
from hpctrain.parallel.layout import Layout

if TYPE_CHECKING:
    from hpctrain.parallel.processes import Distributed

GPT_PLAN = {
    "embed": "embedding",
    "blocks.*.attention.[qkv]": "colwise",
    "blocks.*.attention.out": "rowwise",
    "blocks.*.mlp.up": "colwise",
    "blocks.*.mlp.down": "rowwise",
    "head": "output",
}
# with sequence parallelism: the norms work on a share of the sequence, and the inputs of the
# attention and the MLP are gathered whole before their column-wise projections
GPT_SEQUENCE_PLAN = {
    "blocks.*.norm[12]": "norm",
    "norm": "norm",
    "blocks.*.attention": "gather",
    "blocks.*.mlp": "gather",
}


def checked_plan(model: nn.Module, config, tensor: int) -> dict[str, str]:
    """The plan for `model` (which may be a sketch on the meta device) under
    parallel.tensor=`tensor`, or a ConfigError saying why the split cannot work."""
    p = config.parallel
    plan = plan_for(model, p.tensor_plan, p.sequence_parallel, config.model.name)
    if p.loss_parallel and "output" not in plan.values():
        raise ConfigError(f"parallel.loss_parallel=true splits the output layer's logits over "
                          f"the vocabulary; {config.model.name}'s plan has no such layer (the "
                          "built-in GPT's has): set it to false")
    seq_len = config.data.tokens.seq_len if config.data.kind_spec.vocabulary else None
    check(model, plan, tensor, p.sequence_parallel, seq_len)
    return plan


def plan_for(model: nn.Module, tensor_plan: dict[str, str], sequence_parallel: bool,
             model_name: str) -> dict[str, str]:
    """The plan (pattern -> style) for `model`: the built-in one, or the recipe's."""
    if isinstance(model, GPT):
        if tensor_plan:
            raise ConfigError(f"parallel.tensor_plan: {model_name} has a built-in tensor-"
                              "parallel plan; leave parallel.tensor_plan empty")
        return {**GPT_PLAN, **(GPT_SEQUENCE_PLAN if sequence_parallel else {})}
    vit = _vit_plan(model)
    if vit and not tensor_plan:
        if sequence_parallel:
            raise ConfigError(f"parallel.sequence_parallel=true is built for the GPT; "
                              f"{model_name}'s token count (with its class token) rarely "
                              "divides: set it to false")
        return vit
    if not tensor_plan:
        raise ConfigError(
            f"parallel.tensor > 1: {model_name} has no built-in tensor-parallel plan. Give one "
            "as parallel.tensor_plan, module-name patterns mapped to colwise or rowwise, e.g. "
            "{'layers.*.fc1': colwise, 'layers.*.fc2': rowwise}; the model's modules are: "
            + ", ".join(_linear_names(model)[:12]))
    if sequence_parallel:
        raise ConfigError("parallel.sequence_parallel=true needs a built-in plan (the GPT); "
                          "with parallel.tensor_plan set it to false")
    return dict(tensor_plan)


def _vit_plan(model: nn.Module) -> dict[str, str] | None:
    """The plan for a model built of timm's ViT blocks (attention and MLP), or None when it is
    not one or a block holds what a tensor split cannot divide (a norm over the attention's or
    the MLP's hidden width)."""
    plan: dict[str, str] = {}
    for name, attention in model.named_modules():
        if not isinstance(attention, SplitQKVAttention):
            continue
        owner = name.rpartition(".")[0]
        mlp = getattr(model.get_submodule(owner), "mlp", None)
        firsts = [f for f in ("fc1", "fc1_g", "fc1_x") if hasattr(mlp, f)]
        if (not isinstance(attention.norm, nn.Identity) or type(mlp).__name__ not in
                ("Mlp", "SwiGLU") or not isinstance(mlp.norm, nn.Identity)):
            return None
        at, block = _pattern(name), _pattern(owner)
        plan.update({f"{at}.[qkv]": "colwise", f"{at}.proj": "rowwise",
                     **({f"{at}.gate": "colwise"} if attention.gate is not None else {}),
                     **{f"{block}.mlp.{f}": "colwise" for f in firsts},
                     f"{block}.mlp.fc2": "rowwise"})
    return plan or None


def _pattern(name: str) -> str:
    """A module name with its indices as wildcards: blocks.3.attn -> blocks.*.attn."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def _heads(model: nn.Module) -> int | None:
    if isinstance(model, GPT):
        return model.shape.heads
    return next((m.num_heads for m in model.modules() if isinstance(m, SplitQKVAttention)),
                None)


def _linear_names(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def resolve(model: nn.Module, plan: dict[str, str], strict: bool = True) -> dict[str, str]:
    """Module name -> style for every module the plan's patterns match (the first pattern
    that matches a module wins); with `strict`, a pattern that matches nothing is a
    ConfigError (not so on a pipeline stage, which holds a part of the model)."""
    chosen: dict[str, str] = {}
    for pattern, style in plan.items():
        names = [name for name, _ in model.named_modules()
                 if name and fnmatchcase(name, pattern) and name not in chosen]
        if not names and strict:
            raise ConfigError(f"parallel.tensor_plan: {pattern!r} matches no module of the "
                              "model; its Linear layers are: "
                              + ", ".join(_linear_names(model)[:12]))
        chosen.update(dict.fromkeys(names, style))
    return chosen


def check(model: nn.Module, plan: dict[str, str], tensor: int, sequence_parallel: bool,
          seq_len: int | None) -> None:
    """Refuse a split that does not divide: heads, widths, the vocabulary, the sequence."""
    heads = _heads(model)
    if heads and heads % tensor:
        raise ConfigError(
            f"parallel.tensor={tensor} does not divide the model's {heads} attention heads "
            f"(each rank computes whole heads); use parallel.tensor="
            f"{' or '.join(map(str, _divisors(heads)))}")
    for name, style in resolve(model, plan).items():
        if style in ("norm", "gather"):
            continue  # they split the sequence, checked below
        module = model.get_submodule(name)
        size, what = _split_size(module, style)
        if size is None:
            raise ConfigError(f"parallel.tensor_plan: {name} is a {type(module).__name__}; "
                              f"{style} splits nn.Linear layers only")
        if size % tensor:
            raise ConfigError(
                f"parallel.tensor={tensor} does not divide {name}'s {size} {what} ({style}); "
                f"use parallel.tensor={' or '.join(map(str, _divisors(size)))}")
    if sequence_parallel and seq_len is not None and seq_len % tensor:
        raise ConfigError(
            f"parallel.sequence_parallel=true splits each sequence over the {tensor} ranks, "
            f"but data.tokens.seq_len={seq_len} does not divide; use a seq_len that is a "
            f"multiple of {tensor}")


def _split_size(module: nn.Module, style: str) -> tuple[int | None, str]:
    if style == "embedding" and isinstance(module, nn.Embedding):
        return module.num_embeddings, "vocabulary rows"
    if style in ("colwise", "output") and isinstance(module, nn.Linear):
        return module.out_features, "output features"
    if style == "rowwise" and isinstance(module, nn.Linear):
        return module.in_features, "input features"
    return None, ""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 8) + 1) if n % d == 0]


def apply(model: nn.Module, mesh, plan: dict[str, str], sequence_parallel: bool,
          loss_parallel: bool = False) -> nn.Module:
    """Split `model` (checked whole with checked_plan; here it may be a pipeline stage) over
    the tensor-parallel `mesh` in place; weights tied before are tied after
    (parallelize_module replaces each parameter by a DTensor of its own)."""
    from torch.distributed.tensor.parallel import parallelize_module

    ties = _tied_parameters(model)
    styles = {name: _style(style, sequence_parallel, loss_parallel)
              for name, style in resolve(model, plan, strict=False).items()}
    parallelize_module(model, mesh, styles)
    for names in ties:
        kept = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            split = model.get_parameter(name)
            if getattr(split, "placements", None) != getattr(kept, "placements", None):
                raise ConfigError(f"the tied weights {names[0]} and {name} are split "
                                  "differently by the tensor-parallel plan; give both the same "
                                  "split (e.g. an embedding and a column-wise output layer)")
            setattr(model.get_submodule(owner), attr, kept)
    return model


def _tied_parameters(model: nn.Module) -> list[list[str]]:
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def _style(name: str, sequence_parallel: bool, loss_parallel: bool = False):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    between = Shard(1) if sequence_parallel else Replicate()  # the residual stream's layout
    return {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(output_layouts=between),
        "embedding": lambda: RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        # the logits stay a DTensor: split over the vocabulary for loss parallelism, else
        # whole on each rank, made local where the task reads them (local_logits)
        "output": lambda: ColwiseParallel(input_layouts=between,
                                          output_layouts=Shard(-1) if loss_parallel else
                                          Replicate(), use_local_output=False),
        "norm": lambda: SequenceParallel(),
        "gather": lambda: PrepareModuleInput(input_layouts=(Shard(1),),
                                             desired_input_layouts=(Replicate(),)),
    }[name]()


def local_logits(task):
    """`task` reading a tensor-parallel model's whole logits (a Replicate DTensor, what the
    output layer returns without loss parallelism) as this rank's plain tensor. The model
    itself returns the DTensor: DTensor.to_local() returns a view, and FSDP2 warns of every
    view its root module returns (an in-place op on it would skip its backward hook); made
    local here, past the root, the view is the task's, where nothing changes it in place."""
    import dataclasses

    from torch.distributed.tensor import DTensor

    def local(outputs):
        return outputs.to_local() if isinstance(outputs, DTensor) else outputs

    return dataclasses.replace(
        task, loss=lambda outputs, batch: task.loss(local(outputs), batch),
        sums=lambda outputs, batch, loss, training: task.sums(local(outputs), batch, loss,
                                                               training))


def split_tensors(model: nn.Module, distributed: Distributed, config: Config) -> nn.Module:
    """Tensor parallelism: `model`'s matrices split over its tensor-parallel group, in place
    (after the split was checked on the whole model, before activation checkpointing and FSDP
    wrap the blocks)."""
    if distributed.layout.tensor == 1:
        return model
    p = config.parallel
    plan = plan_for(model, p.tensor_plan, p.sequence_parallel, config.model.name)
    return apply(model, distributed.mesh["tensor"], plan, p.sequence_parallel, p.loss_parallel)


def loss_context(config: Config, layout: Layout):
    """A function giving the context in which the loss and its backward are computed: torch's
    loss_parallel under parallel.loss_parallel (the logits split over the vocabulary)."""
    if config.parallel.loss_parallel and layout.tensor > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel
    return contextlib.nullcontext
