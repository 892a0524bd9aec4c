"""Pipeline parallelism: each rank holds a run of consecutive blocks (a stage), and the batch
flows through the stages in micro-batches, with `torch.distributed.pipelining`.

The model is built whole on every rank (the same seed gives the same weights) and cut down to
this rank's stage in place, the way torchtitan does it: the blocks live in a dict keyed by
layer number, so a stage's parameters keep the names they have in the whole model, and
checkpoints reshard across layouts by name. Two kinds of model are cut:

- the built-in GPT: the first stage keeps the embedding, the last the final norm and the
  output layer. Their weights are tied in the whole model; here each of the two stages holds
  a copy, and after every backward pass the two copies' gradients are added up (Megatron's
  "embedding group"), so the copies stay equal and train as the one tied weight;
- timm's ViTs: the first stage keeps the patch embedding, the class token and the position
  embedding, the last the final norm, the pooling and the head; a stage's forward runs what
  it holds (timm's own forward would run them all).

The schedule runs forward and backward over the micro-batches (GPipe: all forwards, then all
backwards; 1F1B: one forward, one backward in the steady state, so fewer micro-batches'
activations are alive at once) and scales the gradients by 1/micro-batches: a step equals one
process's step on the whole batch. The looped schedules give each rank several stages, stage
i on rank i mod p (interleaved 1F1B, Narayanan et al. 2021; the interleaved zero-bubble
schedule, Qi et al. 2024, which also computes the weights' gradients apart from the inputs'
to fill the bubble): the bubble shrinks by the stages per rank, for as many more sends. A
rank's stages are parts of its one model, each run through the model's forward (so FSDP's
hooks on it run). The loss and the metrics exist on the last stage only. Evaluation sends
each batch through the stages forward only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MethodType

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from hpctrain.errors import ConfigError
from hpctrain.models.gpt import GPT
from hpctrain.models.small import ResNetSmall
from hpctrain.train import stage_split
from hpctrain.train.grad_norm import settle_gradients


def check(model: nn.Module, stages: int, model_name: str, per_rank: int = 1,
          split: str = "equal") -> None:
    """Refuse a split that cannot work: a model that is not a sequence of blocks, or blocks
    that do not divide into equal stages (`per_rank` on each of the `stages` ranks; or, with
    a balanced `split`, fewer blocks than stages)."""
    if _family(model) is None:
        raise ConfigError(f"parallel.pipeline > 1: hpctrain splits the built-in GPT, timm's "
                          f"ViTs and hpctrain's ResNets into stages; {model_name} is none of "
                          "them. Use parallel.tensor or parallel.strategy=fsdp for it")
    layers, total = len(_blocks(model)), stages * per_rank
    if split != "equal" and layers < total:
        raise ConfigError(f"parallel.pipeline={stages} x {per_rank} stage(s) per rank is "
                          f"{total} stages, more than the model's {layers} layers")
    if split == "equal" and layers % total:
        fits = [s for s in range(1, layers + 1) if layers % (s * per_rank) == 0 and s <= 16]
        raise ConfigError(f"parallel.pipeline={stages} with {per_rank} stage(s) per rank does "
                          f"not divide the model's {layers} layers into equal stages; use "
                          f"parallel.pipeline={' or '.join(map(str, fits))}"
                          + (" or fewer parallel.stages_per_rank" if per_rank > 1 else "")
                          + ", or parallel.stage_split=parameters or time (unequal runs)")


def stages_per_rank(config) -> int:
    """parallel.stages_per_rank: auto is 2 under the looped schedules, 1 otherwise."""
    p = config.parallel
    if p.stages_per_rank == "auto":
        return 2 if p.schedule in LOOPED else 1
    if p.stages_per_rank > 1 and p.schedule not in LOOPED:
        raise ConfigError(f"parallel.stages_per_rank={p.stages_per_rank} needs a looped "
                          f"schedule ({' or '.join(LOOPED)}); parallel.schedule={p.schedule} "
                          "runs one stage per rank")
    return p.stages_per_rank


LOOPED = ("interleaved-1f1b", "zero-bubble")


def _is_vit(model: nn.Module) -> bool:
    from timm.models.vision_transformer import VisionTransformer

    return isinstance(model, VisionTransformer)


def _family(model: nn.Module) -> str | None:
    """Which of the models hpctrain cuts into stages `model` is: the built-in GPT, timm's
    ViTs, hpctrain's ResNets (their stages are the blocks), or None."""
    if isinstance(model, GPT):
        return "gpt"
    if _is_vit(model):
        return "vit"
    return "resnet" if isinstance(model, ResNetSmall) else None


def _blocks_name(model: nn.Module) -> str:
    return "stages" if _family(model) == "resnet" else "blocks"


def _blocks(model: nn.Module) -> nn.Module:
    """The model's run of blocks (a Sequential, or after the cut a dict keyed alike)."""
    return getattr(model, _blocks_name(model))


@dataclass(frozen=True)
class Part:
    """One stage's share of the model: its blocks (by key), and whether it embeds the input
    (the first stage) or ends in the head (the last)."""

    keys: tuple[str, ...]
    first: bool
    last: bool


def stage_blocks(model: nn.Module, split: str, stages: int, inputs: Callable,
                 distributed) -> list[int]:
    """Blocks per stage under parallel.stage_split (stage_split.py): `inputs()` makes a
    micro-batch for timing; rank 0's split reaches every rank."""
    layers = len(_blocks(model))
    if split == "equal":
        return [layers // stages] * stages
    blocks = list(_blocks(model).children())
    first, last, tokens = _ends(model)
    if split == "parameters":
        costs = stage_split.parameter_costs(blocks, first, last, tokens)
    else:
        costs = None
        if distributed.is_main:
            costs = stage_split.time_costs(blocks, lambda x: _embed(model, x),
                                           lambda x: _head(model, x), inputs())
            model.zero_grad(set_to_none=True)  # the timing's backward passes left some
        costs = distributed.broadcast(costs)
    return stage_split.balanced(*costs, stages)


def sample_inputs(model: nn.Module, config, microbatch: int, device: torch.device):
    """A micro-batch of the run's shape, for timing the blocks: token ids, or images."""
    if isinstance(model, GPT):
        return torch.randint(0, model.embed.num_embeddings,
                             (microbatch, config.data.tokens.seq_len), device=device)
    size = model.patch_embed.img_size if _is_vit(model) else (config.data.image_size,) * 2
    return torch.randn(microbatch, 3, *size, device=device)


def cut_to_stage(model: nn.Module, rank_stage: int, stages: int, per_rank: int = 1,
                 blocks: list[int] | None = None) -> tuple[nn.Module, list[Part]]:
    """`model` (checked) reduced in place to what pipeline rank `rank_stage` of `stages`
    holds: the blocks of its stages (rank_stage, + stages, ...; `blocks`: how many each of
    all the stages has, equal by default) and, with the first and last stage, what comes
    before and after them; and those stages' Parts, in order. The model's forward then runs
    one Part (by default its first)."""
    if not isinstance(_blocks(model), nn.ModuleDict):  # keyed as the Sequential was: the
        setattr(model, _blocks_name(model),  # same parameter names
                nn.ModuleDict(dict(_blocks(model).named_children())))
    total = stages * per_rank
    blocks = blocks or [len(_blocks(model)) // total] * total
    names = list(_blocks(model).keys())
    starts = [sum(blocks[:i]) for i in range(total + 1)]
    parts = [Part(tuple(names[starts[i]:starts[i + 1]]), i == 0, i == total - 1)
             for i in range(rank_stage, total, stages)]
    keep = {key for part in parts for key in part.keys}
    for name in [n for n in names if n not in keep]:
        del _blocks(model)[name]
    first, last = parts[0].first, parts[-1].last
    if isinstance(model, GPT):
        if last:
            model.head.weight = nn.Parameter(model.head.weight.detach().clone())
        if not first:
            model.embed = None
        if not last:
            model.norm = model.head = None
    elif _family(model) == "resnet":
        if not first:
            model.stem = None
        if not last:
            model.head = None
    else:
        if not first:
            model.patch_embed = model.norm_pre = None
            for name in ("cls_token", "reg_token", "pos_embed"):
                if getattr(model, name, None) is not None:
                    setattr(model, name, None)
        if not last:
            model.norm = model.fc_norm = model.head = model.attn_pool = None

    def forward(self, x: torch.Tensor, part: Part = parts[0]) -> torch.Tensor:
        return _run(self, x, part)
    model.forward = MethodType(forward, model)
    return model, parts


def _run(model: nn.Module, x: torch.Tensor, part: Part) -> torch.Tensor:
    """The model's forward (the GPT's, timm's VisionTransformer's) for one Part."""
    if part.first:
        x = _embed(model, x)
    # timm's own activation checkpointing; the GPT's blocks have it as wrappers
    recompute = getattr(model, "grad_checkpointing", False) and torch.is_grad_enabled()
    for key in part.keys:
        block = _blocks(model)[key]
        x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
    return _head(model, x) if part.last else x


def _embed(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    family = _family(model)
    if family == "gpt":
        return model.embed(x)
    if family == "resnet":
        return model.stem(x)
    return model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))


def _head(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    family = _family(model)
    if family == "gpt":
        return model.head(model.norm(x))
    return model.head(x) if family == "resnet" else model.forward_head(model.norm(x))


def _ends(model: nn.Module) -> tuple[list, list, tuple]:
    """(the modules before the blocks, those after, parameters of the model's own before
    them: timm's class, register and position tokens)."""
    if isinstance(model, GPT):
        return [model.embed], [model.norm, model.head], ()
    if _family(model) == "resnet":
        return [model.stem], [model.head], ()
    return ([model.patch_embed, model.norm_pre],
            [model.norm, model.fc_norm, model.head, model.attn_pool],
            tuple(model.parameters(recurse=False)))


def _part_parameters(model: nn.Module, part: Part):
    """The parameters one Part uses, looked up anew each time (FSDP swaps them)."""
    first, last, tokens = _ends(model) if (part.first or part.last) else ([], [], ())
    modules = [_blocks(model)[key] for key in part.keys]
    if part.first:
        modules += first
        yield from tokens
    if part.last:
        modules += last
    for module in modules:
        if module is not None:
            yield from module.parameters()


class VirtualStage(nn.Module):
    """One of a rank's stages under a looped schedule: its Part of the rank's model, run
    through the model's forward. The model is not a submodule (its parameters belong to it
    once); the Part's parameters are offered for the zero-bubble weight gradients."""

    def __init__(self, model: nn.Module, part: Part):
        super().__init__()
        self.part = part
        self._model = (model,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._model[0](x, part=self.part)

    def parameters(self, recurse: bool = True):
        return _part_parameters(self._model[0], self.part)


def stream_shape(model: nn.Module, sequence_shards: int,
                 sample: Callable) -> Callable[[torch.Tensor, str], tuple]:
    """What reaches block `key` of the whole `model` (not yet cut) for a batch of `inputs`: (batch, tokens, width), the GPT's tokens split over the ranks under sequence
    parallelism, the ViT's its patches and class (and register) tokens; a ResNet's feature
    maps, whose shape changes from block to block, found by a forward pass of `sample()`
    (one image, in evaluation mode: no BatchNorm statistics change)."""
    if isinstance(model, GPT):
        width = model.shape.width
        return lambda inputs, key: (inputs.shape[0], inputs.shape[1] // sequence_shards,
                                    width)
    if _is_vit(model):
        tokens, width = model.patch_embed.num_patches + model.num_prefix_tokens, \
            model.embed_dim
        return lambda inputs, key: (inputs.shape[0], tokens, width)
    shapes = {}  # before each block
    model.eval()
    with torch.no_grad():
        x = _embed(model, sample())
        for key, block in _blocks(model).named_children():
            shapes[key] = tuple(x.shape[1:])
            x = block(x)
    model.train()
    return lambda inputs, key: (inputs.shape[0], *shapes[key])


@dataclass
class Pipeline:
    """This rank's stages, their schedule, and the ranks it trades activations with."""

    module: nn.Module
    parts: list[Part]
    schedule: object
    previous: int  # global ranks of the neighbouring pipeline ranks (same data, tensor
    following: int  # index; looped: the last rank's previous is the first)
    tied: object | None  # the group {first stage, last stage} that adds up the tied gradients
    stream: Callable[[torch.Tensor, str], tuple]  # the shape reaching a block, for a batch
    stages: int  # in all
    microbatches: int

    @property
    def first(self) -> bool:
        return self.parts[0].first

    @property
    def last(self) -> bool:
        return self.parts[-1].last

    @property
    def copies(self) -> tuple:
        """Parameters that copy one on another stage: the last stage's output layer."""
        return (self.module.head.weight,) if self.last and self.tied is not None else ()

    def describe(self) -> str:
        held = " | ".join(" ".join(part.keys) for part in self.parts)
        return (f"{self.stages} stages, {len(self.parts)} on each rank (blocks {held} on this "
                f"one), {type(self.schedule).__name__}, {self.microbatches} micro-batches "
                "per step")

    def train_step(self, batch, precision) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Forward and backward of `batch` over the micro-batches; (outputs, mean loss) on the
        last stage, (None, None) on the others."""
        losses: list[torch.Tensor] = []
        with precision.autocast():
            if self.first:
                outputs = self.schedule.step(batch.inputs, target=batch.targets if self.last
                                             else None, losses=losses)
            elif self.last:
                outputs = self.schedule.step(target=batch.targets, losses=losses)
            else:
                outputs = self.schedule.step()
        self._add_tied_gradients()
        if not self.last:
            return None, None
        return outputs, torch.stack([loss.detach() for loss in losses]).mean()

    def _add_tied_gradients(self) -> None:
        if self.tied is None:
            return
        weight = self.module.embed.weight if self.first else self.module.head.weight
        if weight.grad is not None:  # the two copies are split alike (FSDP, tensor): add pieces
            settle_gradients([weight])
            grad = weight.grad
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad,
                            group=self.tied)

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """The whole model's output for `inputs` (evaluation), on the last stage; None on the
        others. Stage by stage: each of this rank's takes the stream from the rank before
        (the first stage, the inputs) and passes it on (the last stage keeps the output)."""
        out = None
        for part in self.parts:
            stream = inputs
            if not part.first:
                stream = torch.empty(self.stream(inputs, part.keys[0]), device=inputs.device)
                dist.recv(stream, src=self.previous)
            out = self.module(stream, part=part)
            if not part.last:
                dist.send(out.float().contiguous(), dst=self.following)
        return out if self.last else None


def build(model: nn.Module, parts: list[Part], loss_fn, layout, rank: int,
          device: torch.device, schedule: str, microbatches: int, group,
          stream: Callable) -> Pipeline:
    """This rank's Pipeline over `model` (already cut to its `parts` and wrapped); `stream`:
    stream_shape of the whole model."""
    from torch.distributed import pipelining

    rank_stage, _, _ = layout.coordinates(rank)
    p, stride = layout.pipeline, layout.ranks_per_stage  # a neighbour is one stride away
    tied = None
    if isinstance(model, GPT):  # one tied group per (data, tensor) position; every rank
        for first in range(stride):  # takes part in creating each
            group_ranks = [first, first + (p - 1) * stride]
            made = dist.new_group(group_ranks)
            if rank in group_ranks:
                tied = made
    total = p * len(parts)
    kind = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
            "interleaved-1f1b": "ScheduleInterleaved1F1B",
            "zero-bubble": "ScheduleInterleavedZeroBubble"}[schedule]
    if not hasattr(pipelining, kind):
        raise ConfigError(f"parallel.schedule={schedule}: the installed torch "
                          f"{torch.__version__} has no {kind}; use 1f1b")
    if schedule in LOOPED:
        stages = [pipelining.PipelineStage(VirtualStage(model, part), rank_stage + k * p,
                                           total, device, group=group)
                  for k, part in enumerate(parts)]
    else:
        stages = pipelining.PipelineStage(model, rank_stage, total, device, group=group)
    position = rank - rank_stage * stride
    return Pipeline(model, parts,
                    getattr(pipelining, kind)(stages, n_microbatches=microbatches,
                                              loss_fn=loss_fn),
                    position + (rank_stage - 1) % p * stride,
                    position + (rank_stage + 1) % p * stride, tied, stream, total,
                    microbatches)
