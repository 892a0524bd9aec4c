"""Pipeline parallelism: each rank holds a run of consecutive blocks (a stage), and the batch
flows through the stages in micro-batches, with `torch.distributed.pipelining`.

The model is built whole on every rank (the same seed gives the same weights) and cut down to
this rank's stage in place, the way torchtitan does it: the blocks live in a dict keyed by
layer number, so a stage's parameters keep the names they have in the whole model, and
checkpoints reshard across layouts by name. Three kinds of model are cut (a Family each):

- the built-in GPT: the first stage keeps the embedding, the last the final norm and the
  output layer. Their weights are tied in the whole model; here each of the two stages holds
  a copy, and after every backward pass the two copies' gradients are added up (Megatron's
  "embedding group"), so the copies stay equal and train as the one tied weight;
- timm's ViTs: the first stage keeps the patch embedding, the class token and the position
  embedding, the last the final norm, the pooling and the head; a stage's forward runs what
  it holds (timm's own forward would run them all);
- hpctrain's ResNets, at their stages: the stem goes with the first, the head with the last.

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

import sys
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
from hpctrain.parallel import stage_split
from hpctrain.parallel.grad_norm import settle_gradients


@dataclass(frozen=True)
class Family:
    """A kind of model hpctrain cuts into stages: where its blocks are, what comes before
    them (the first stage's) and after them (the last stage's), and how those run."""

    name: str
    blocks: str  # the attribute holding the run of blocks
    before: tuple[str, ...]  # modules before the blocks
    tokens: tuple[str, ...]  # the model's own parameters before the blocks
    after: tuple[str, ...]  # modules after the blocks
    embed: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    head: Callable[[nn.Module, torch.Tensor], torch.Tensor]


GPT_FAMILY = Family("gpt", "blocks", ("embed",), (), ("norm", "head"),
                    lambda m, x: m.embed(x), lambda m, x: m.head(m.norm(x)))
VIT_FAMILY = Family("vit", "blocks", ("patch_embed", "norm_pre"),
                    ("cls_token", "reg_token", "pos_embed"),
                    ("norm", "fc_norm", "head", "attn_pool"),
                    lambda m, x: m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(x)))),
                    lambda m, x: m.forward_head(m.norm(x)))
RESNET_FAMILY = Family("resnet", "stages", ("stem",), (), ("head",),
                       lambda m, x: m.stem(x), lambda m, x: m.head(x))


def family_of(model: nn.Module) -> Family | None:
    """The built-in GPT, timm's ViTs, hpctrain's ResNets (their stages are the blocks). timm
    is asked only where a model of its was built (importing it takes seconds: `hpctrain
    memory gpt-1b` spent three of its twenty here)."""
    if isinstance(model, GPT):
        return GPT_FAMILY
    if isinstance(model, ResNetSmall):
        return RESNET_FAMILY
    vit = sys.modules.get("timm.models.vision_transformer")
    return VIT_FAMILY if vit and isinstance(model, vit.VisionTransformer) else None


def check(model: nn.Module, stages: int, model_name: str, per_rank: int = 1,
          split: str = "equal") -> None:
    """Refuse a split that cannot work: a model that is not a sequence of blocks, or blocks
    that do not divide into equal stages (`per_rank` on each of the `stages` ranks; or, with
    a balanced `split`, fewer blocks than stages)."""
    family = family_of(model)
    if family is None:
        raise ConfigError(f"parallel.pipeline > 1: hpctrain splits the built-in GPT, timm's "
                          f"ViTs and hpctrain's ResNets into stages; {model_name} is none of "
                          "them. Use parallel.tensor or parallel.strategy=fsdp for it")
    layers, total = len(getattr(model, family.blocks)), stages * per_rank
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
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved-1f1b": "ScheduleInterleaved1F1B",
             "zero-bubble": "ScheduleInterleavedZeroBubble"}


def schedule_class(schedule: str):
    """torch's class for parallel.schedule, or a ConfigError where the installed torch
    lacks it (checked before any process waits)."""
    from torch.distributed import pipelining

    kind = SCHEDULES[schedule]
    if not hasattr(pipelining, kind):
        raise ConfigError(f"parallel.schedule={schedule}: the installed torch "
                          f"{torch.__version__} has no {kind}; use 1f1b")
    return getattr(pipelining, kind)


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
    family = family_of(model)
    blocks = list(getattr(model, family.blocks).children())
    if split == "equal":
        return [len(blocks) // stages] * stages
    first, last, tokens = _ends(model, family)
    if split == "parameters":
        costs = stage_split.parameter_costs(blocks, first, last, tokens)
    else:
        costs = None
        if distributed.is_main:
            costs = stage_split.time_costs(blocks, lambda x: family.embed(model, x),
                                           lambda x: family.head(model, x), inputs())
            model.zero_grad(set_to_none=True)  # the timing's backward passes left some
        costs = distributed.broadcast(costs)
    return stage_split.balanced(*costs, stages)


def sample_inputs(model: nn.Module, config, microbatch: int, device: torch.device):
    """A micro-batch of the run's shape, for timing the blocks: token ids, or images."""
    family = family_of(model)
    if family is GPT_FAMILY:
        return torch.randint(0, model.embed.num_embeddings,
                             (microbatch, config.data.tokens.seq_len), device=device)
    if family is VIT_FAMILY:
        return torch.randn(microbatch, 3, *model.patch_embed.img_size, device=device)
    shape = config.data.kind_spec.sample_shape(config.data)  # the largest the run feeds
    return torch.randn(microbatch, *shape, device=device)


def cut_to_stage(model: nn.Module, rank_stage: int, stages: int, per_rank: int = 1,
                 blocks: list[int] | None = None) -> tuple[nn.Module, list[Part]]:
    """`model` (checked) reduced in place to what pipeline rank `rank_stage` of `stages`
    holds: the blocks of its stages (rank_stage, + stages, ...; `blocks`: how many each of
    all the stages has, equal by default) and, with the first and last stage, what comes
    before and after them; and those stages' Parts, in order. The model's forward then runs
    one Part (by default its first)."""
    family = family_of(model)
    run = nn.ModuleDict(dict(getattr(model, family.blocks).named_children()))
    setattr(model, family.blocks, run)  # keyed as the Sequential was: the same names
    total = stages * per_rank
    blocks = blocks or [len(run) // total] * total
    names = list(run.keys())
    starts = [sum(blocks[:i]) for i in range(total + 1)]
    parts = [Part(tuple(names[starts[i]:starts[i + 1]]), i == 0, i == total - 1)
             for i in range(rank_stage, total, stages)]
    keep = {key for part in parts for key in part.keys}
    for name in [n for n in names if n not in keep]:
        del run[name]
    if family is GPT_FAMILY and parts[-1].last:  # the tied output weight: a copy here
        model.head.weight = nn.Parameter(model.head.weight.detach().clone())
    dropped = (() if parts[0].first else family.before + family.tokens) + \
        (() if parts[-1].last else family.after)
    for name in dropped:
        if getattr(model, name, None) is not None:
            setattr(model, name, None)

    def forward(self, x: torch.Tensor, part: Part = parts[0]) -> torch.Tensor:
        return _run(self, family, x, part)
    model.forward = MethodType(forward, model)
    return model, parts


def _run(model: nn.Module, family: Family, x: torch.Tensor, part: Part) -> torch.Tensor:
    """The model's forward for one Part."""
    if part.first:
        x = family.embed(model, x)
    # timm's own activation checkpointing; the GPT's blocks have it as wrappers
    recompute = getattr(model, "grad_checkpointing", False) and torch.is_grad_enabled()
    run = getattr(model, family.blocks)
    for key in part.keys:
        x = checkpoint(run[key], x, use_reentrant=False) if recompute else run[key](x)
    return family.head(model, x) if part.last else x


def _ends(model: nn.Module, family: Family) -> tuple[list, list, tuple]:
    """(the modules before the blocks, those after, the model's own parameters before
    them: timm's class, register and position tokens); None where a stage lacks them."""
    def held(names):
        return [getattr(model, name, None) for name in names]
    return held(family.before), held(family.after), \
        tuple(t for t in held(family.tokens) if t is not None)


def _part_parameters(model: nn.Module, family: Family, part: Part):
    """The parameters one Part uses, looked up anew each time (FSDP swaps them)."""
    first, last, tokens = _ends(model, family)
    run = getattr(model, family.blocks)
    modules = [run[key] for key in part.keys]
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
        self._model = (model, family_of(model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._model[0](x, part=self.part)

    def parameters(self, recurse: bool = True):
        return _part_parameters(*self._model, self.part)


def stream_shape(model: nn.Module, sequence_shards: int,
                 sample: Callable) -> Callable[[torch.Tensor, str], tuple]:
    """What reaches block `key` of the whole `model` (not yet cut) for a batch of `inputs`:
    (batch, tokens, width), the GPT's tokens split over the ranks under sequence
    parallelism, the ViT's its patches and class (and register) tokens; a ResNet's feature
    maps, whose shape changes from block to block, found by a forward pass of `sample()`
    (one image, in evaluation mode: no BatchNorm statistics change)."""
    family = family_of(model)
    if family is GPT_FAMILY:
        width = model.shape.width
        return lambda inputs, key: (inputs.shape[0], inputs.shape[1] // sequence_shards,
                                    width)
    if family is VIT_FAMILY:
        tokens, width = model.patch_embed.num_patches + model.num_prefix_tokens, \
            model.embed_dim
        return lambda inputs, key: (inputs.shape[0], tokens, width)
    shapes = {}  # before each block
    model.eval()
    with torch.no_grad():
        x = family.embed(model, sample())
        for key, block in getattr(model, family.blocks).named_children():
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
    if schedule in LOOPED:
        stages = [pipelining.PipelineStage(VirtualStage(model, part), rank_stage + k * p,
                                           total, device, group=group)
                  for k, part in enumerate(parts)]
    else:
        stages = pipelining.PipelineStage(model, rank_stage, total, device, group=group)
    position = rank - rank_stage * stride
    return Pipeline(model, parts,
                    schedule_class(schedule)(stages, n_microbatches=microbatches,
                                             loss_fn=loss_fn),
                    position + (rank_stage - 1) % p * stride,
                    position + (rank_stage + 1) % p * stride, tied, stream, total,
                    microbatches)
