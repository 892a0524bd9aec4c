"""Pipeline parallelism: each rank holds a run of consecutive blocks (a stage), and the batch
flows through the stages in micro-batches, with `torch.distributed.pipelining`.

The model is built whole on every rank (the same seed gives the same weights) and cut down to
this rank's stage in place, the way torchtitan does it: the GPT keeps its blocks in a dict
keyed by layer number, so a stage's parameters keep the names they have in the whole model,
and checkpoints reshard across layouts by name. The first stage keeps the embedding, the last
the final norm and the output layer. Their weights are tied in the whole model; here each of
the two stages holds a copy, and after every backward pass the two copies' gradients are added
up (Megatron's "embedding group"), so the copies stay equal and train as the one tied weight.

The schedule runs forward and backward over the micro-batches (GPipe: all forwards, then all
backwards; 1F1B: one forward, one backward in the steady state, so fewer micro-batches'
activations are alive at once) and scales the gradients by 1/micro-batches: a step equals one
process's step on the whole batch. The loss and the metrics exist on the last stage only.
Evaluation sends each batch through the stages forward only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from hpctrain.errors import ConfigError
from hpctrain.models.gpt import GPT
from hpctrain.train.grad_norm import settle_gradients


def check(model: nn.Module, stages: int, model_name: str) -> None:
    """Refuse a split that cannot work: a model that is not a sequence of blocks, or blocks
    that do not divide into equal stages."""
    if not isinstance(model, GPT):
        raise ConfigError(f"parallel.pipeline > 1: hpctrain splits the built-in GPT into "
                          f"stages; {model_name} is not one yet. Use parallel.tensor or "
                          "parallel.strategy=fsdp for it")
    layers = len(model.blocks)
    if layers % stages:
        fits = [s for s in range(1, layers + 1) if layers % s == 0 and s <= 16]
        raise ConfigError(f"parallel.pipeline={stages} does not divide the model's {layers} "
                          f"layers into equal stages; use parallel.pipeline="
                          f"{' or '.join(map(str, fits))}")


def cut_to_stage(model: GPT, stage: int, stages: int) -> GPT:
    """`model` reduced in place to stage `stage` of `stages`: its share of the blocks, the
    embedding on the first stage, the norm and the output layer (an untied copy) on the
    last."""
    per_stage = len(model.blocks) // stages
    keep = set(list(model.blocks.keys())[stage * per_stage:(stage + 1) * per_stage])
    for name in [n for n in model.blocks.keys() if n not in keep]:
        del model.blocks[name]
    if stage == stages - 1:
        model.head.weight = nn.Parameter(model.head.weight.detach().clone())
    if stage != 0:
        model.embed = None
    if stage != stages - 1:
        model.norm = model.head = None
    return model


@dataclass
class Pipeline:
    """This rank's stage, its schedule, and the ranks it trades activations with."""

    module: nn.Module
    stage: int
    stages: int
    schedule: object
    previous: int | None  # global ranks of the neighbouring stages (same data, tensor index)
    following: int | None
    tied: object | None  # the group {first stage, last stage} that adds up the tied gradients
    width: int  # of the residual stream the stages pass on
    sequence_shards: int  # its split over the sequence (tensor size under sequence parallelism)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def copies(self) -> tuple:
        """Parameters that copy one on another stage: the last stage's output layer."""
        return (self.module.head.weight,) if self.last and self.tied is not None else ()

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
        others."""
        stream = inputs
        if not self.first:
            batch, time = inputs.shape
            stream = torch.empty((batch, time // self.sequence_shards, self.width),
                                 device=inputs.device)
            dist.recv(stream, src=self.previous)
        out = self.module(stream)
        if not self.last:
            dist.send(out.float().contiguous(), dst=self.following)
            return None
        return out


def build(model: nn.Module, loss_fn, layout, rank: int, device: torch.device,
          schedule: str, microbatches: int, group, sequence_parallel: bool) -> Pipeline:
    """This rank's Pipeline over `model` (already cut to its stage and wrapped)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage, _, _ = layout.coordinates(rank)
    stride = layout.ranks_per_stage  # a neighbouring stage is one stride away
    # one tied group per (data, tensor) position; every rank takes part in creating each
    tied = None
    for first in range(stride):
        group_ranks = [first, first + (layout.pipeline - 1) * stride]
        made = dist.new_group(group_ranks)
        if rank in group_ranks:
            tied = made
    piece = PipelineStage(model, stage, layout.pipeline, device, group=group)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    return Pipeline(model, stage, layout.pipeline,
                    kind(piece, n_microbatches=microbatches, loss_fn=loss_fn),
                    rank - stride if stage > 0 else None,
                    rank + stride if stage < layout.pipeline - 1 else None, tied,
                    model.shape.width, layout.tensor if sequence_parallel else 1)
