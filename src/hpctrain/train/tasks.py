"""The task: what the loop does with a batch, the one place where images, tokens and point
clouds differ.

A task is a record of four functions and two names, not a class hierarchy:
- `to_device(batch, training)`: the loader's batch on the device as a `Batch` (normalised,
  laid out, mixed for images; inputs and shifted targets for tokens);
- `loss(outputs, batch)`: the training objective;
- `sums(outputs, batch, loss, training)`: the figures to accumulate, as one device vector
  (counts and sums only, so micro-steps, intervals and ranks add up; nothing is read back per
  step); what only evaluation reports is left at zero in training;
- `values(sums)`: those sums read back as named metrics (accuracy, perplexity, ...).
`unit` names what throughput counts (images, tokens, clouds) and `unit_sum` which sum counts it (None:
the samples are the unit). Evaluation runs the same functions in eval mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from hpctrain.data.mixing import build_mixing
from hpctrain.data.points import perturb
from hpctrain.data.tokens import IGNORE
from hpctrain.errors import ConfigError


@dataclass
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor  # what the loss compares with (soft labels under mixing)
    labels: torch.Tensor  # what the metrics compare with

    def first(self, rows: int) -> Batch:
        """The first `rows` samples (evaluation leaves out the sampler's padding repeats)."""
        return Batch(self.inputs[:rows], self.targets[:rows], self.labels[:rows])


@dataclass(frozen=True)
class Task:
    name: str
    unit: str  # what throughput counts: images | tokens | clouds
    sum_names: tuple[str, ...]
    unit_sum: str | None
    to_device: Callable[[object, bool], Batch]
    loss: Callable[[torch.Tensor, Batch], torch.Tensor]
    sums: Callable[[torch.Tensor, Batch, torch.Tensor, bool], torch.Tensor]
    values: Callable[[dict], dict]
    own_metrics: tuple[str, ...] = ()  # the recipe's task.metrics, recorded in training too


# ---- image classification -------------------------------------------------------------------

def _soft_target_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against mixed (soft) targets, timm's SoftTargetCrossEntropy: written
    out here, as importing timm costs every run a second and a half."""
    return torch.sum(-targets * F.log_softmax(logits, dim=-1), dim=-1).mean()


def image_classification(batcher, augment, num_classes: int, label_smoothing: float,
                         batch_size: int, model_name: str) -> Task:
    """Top-1 accuracy; mixup/CutMix (soft targets) in training when the recipe asks."""
    mixing = build_mixing(augment, num_classes, label_smoothing, batch_size)
    soft, hard = _soft_target_loss, nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def loss(logits, batch: Batch) -> torch.Tensor:  # soft targets come from mixing
        return (soft if batch.targets.dim() == 2 else hard)(logits, batch.targets)

    def to_device(batch, training: bool) -> Batch:
        images, labels = batcher(*batch)
        if training and mixing is not None:
            mixed, targets = mixing(images, labels)
            return Batch(mixed, targets, labels)
        return Batch(images, labels, labels)

    return Task("image_classification", "images", ("correct", "samples"), None, to_device,
                loss, top1_sums(num_classes, model_name), top1_accuracy)


def top1_sums(num_classes: int, model_name: str) -> Callable:
    """The sums of top-1 accuracy, for logits of `num_classes` classes: a model with another
    number of outputs (a factory that was not given the data's classes trains a 1,000-way
    head on 8 classes without a word) is refused at its first batch, naming the setting."""
    def sums(logits, batch: Batch, loss, training: bool) -> torch.Tensor:
        if logits.shape[-1] != num_classes:
            raise ConfigError(
                f"model.name {model_name} gives {logits.shape[-1]} outputs per sample, but "
                f"the data has {num_classes} classes: build it for the data's classes (a "
                f"factory's num_classes parameter, or model.kwargs.num_classes={num_classes})")
        correct = (logits.argmax(dim=1) == batch.labels).sum()
        return torch.stack([correct, correct.new_full((), len(batch.labels))])
    return sums


def top1_accuracy(sums: dict) -> dict:
    return {"accuracy": sums["correct"] / max(sums["samples"], 1)}


# ---- point-cloud classification -------------------------------------------------------------

def point_cloud_classification(device: torch.device, augment, up_axis: int,
                               label_smoothing: float, num_classes: int,
                               model_name: str) -> Task:
    """Top-1 accuracy over clouds (batch, points, 3), perturbed on the device in training
    (data.points). A model that returns (logits, regulariser) while training, as PointNet does
    with its feature transform's, has the regulariser added to the loss."""
    criterion = with_regulariser(nn.CrossEntropyLoss(label_smoothing=label_smoothing))

    def to_device(batch, training: bool) -> Batch:
        points, labels = (t.to(device, non_blocking=True) for t in batch)
        if training:
            points = perturb(points, augment, up_axis)
        return Batch(points, labels, labels)

    def loss(outputs, batch: Batch) -> torch.Tensor:
        return criterion(outputs, batch.targets)

    top1 = top1_sums(num_classes, model_name)

    def sums(outputs, batch: Batch, loss, training: bool) -> torch.Tensor:
        return top1(logits_of(outputs), batch, loss, training)

    return Task("point_cloud_classification", "clouds", ("correct", "samples"), None,
                to_device, loss, sums, top1_accuracy)


def logits_of(outputs) -> torch.Tensor:
    """The logits of a model that returns them alone or as (logits, regulariser)."""
    return outputs[0] if isinstance(outputs, tuple) else outputs


def with_regulariser(criterion: Callable) -> Callable:
    """`criterion(outputs, targets)`, plus the regulariser of a model that returns
    (logits, regulariser) while training (PointNet's feature transform)."""
    def loss(outputs, targets: torch.Tensor) -> torch.Tensor:
        if isinstance(outputs, tuple):
            return criterion(outputs[0], targets) + outputs[1]
        return criterion(outputs, targets)
    return loss


# ---- language modelling ---------------------------------------------------------------------

def language_modeling(device: torch.device, answer: tuple[int, int] | None) -> Task:
    """Next-token prediction: loss per token, perplexity, token accuracy, the share of padding,
    and, where the data marks answers (`answer` = (start id, end id): the tokens after start
    up to and including end), the share of answers predicted entirely right."""

    def to_device(batch, training: bool) -> Batch:
        if isinstance(batch, dict):  # documents, padded (sequences.pad_collate)
            ids = batch["tokens"].to(device, non_blocking=True).long()
            lengths = batch["lengths"].to(device, non_blocking=True)
            targets = ids[:, 1:].clone()
            positions = torch.arange(targets.shape[1], device=device)
            targets[positions[None, :] >= (lengths[:, None] - 1)] = IGNORE
            return Batch(ids[:, :-1], targets, targets)
        ids = batch.to(device, non_blocking=True).long()  # blocks: nothing is padding
        return Batch(ids[:, :-1], ids[:, 1:], ids[:, 1:])

    def loss(logits, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(),
                               ignore_index=IGNORE)

    def sums(logits, batch: Batch, loss, training: bool) -> torch.Tensor:
        real = batch.targets != IGNORE
        tokens = real.sum()
        loss = loss.full_tensor() if isinstance(loss, DTensor) else loss  # loss parallelism
        # right where the target scores highest (a tie counts as right): a max and a gather,
        # where an argmax over the vocabulary cost 9x as much on the CPU (benchmarks/lm_overhead)
        target_score, best = _target_and_best(logits, batch.targets.clamp(min=0))
        right = (target_score >= best) & real
        graded = answer is not None and not training  # answers: an evaluation figure
        answers = answer_sums(batch.inputs, batch.targets, right, answer) if graded else \
            tokens.new_zeros(2)
        return torch.cat([torch.stack([loss.float() * tokens, right.sum(), tokens,
                                       tokens.new_full((), real.numel())]),
                          answers]).float()

    def values(s: dict) -> dict:
        tokens = max(s["tokens"], 1)
        result = {"loss": s["loss_sum"] / tokens,
                  "perplexity": math.exp(min(s["loss_sum"] / tokens, 700.0)),
                  "accuracy": s["right"] / tokens,
                  "padding_fraction": 1 - s["tokens"] / max(s["positions"], 1)}
        if answer is not None and s["answers"]:
            result["answer_accuracy"] = s["answers_right"] / max(s["answers"], 1)
        return result

    return Task("language_modeling", "tokens",
                ("loss_sum", "right", "tokens", "positions", "answers_right", "answers"),
                "tokens", to_device, loss, sums, values)


def _target_and_best(logits, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's score of its target and its highest score. Logits split over the
    vocabulary (loss parallelism: a DTensor sharded on its last dimension) are never
    gathered: each rank scores the targets in its share (the others -inf) and takes its
    maximum, and the ranks' maxima are taken."""
    if not isinstance(logits, DTensor):
        return (logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1), logits.amax(dim=-1))
    import torch.distributed as dist

    local = logits.to_local()
    share = local.shape[-1]
    offset = logits.device_mesh.get_local_rank() * share
    index = targets - offset
    mine = (index >= 0) & (index < share)
    score = local.gather(-1, index.clamp(0, share - 1).unsqueeze(-1)).squeeze(-1)
    both = torch.stack([torch.where(mine, score, torch.full_like(score, -math.inf)),
                        local.amax(dim=-1)])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=logits.device_mesh.get_group())
    return both[0], both[1]


def answer_sums(inputs: torch.Tensor, targets: torch.Tensor, right: torch.Tensor,
                answer: tuple[int, int]) -> torch.Tensor:
    """[answers entirely right, answers] in a batch, on the device.

    The answer of a row's problem is every target after an input `start` token up to the target
    `end` token. For each target that ends an answer, its span's wrong predictions are counted
    as the difference of a running count of wrong answer tokens at its end and just before its
    start. An answer cut off by the end of a row is not counted."""
    start, end = answer
    positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)
    last_start = torch.where(inputs == start, positions, -1).cummax(dim=1).values
    last_end = torch.where(inputs == end, positions, -1).cummax(dim=1).values
    inside = last_start > last_end  # the target at this position belongs to an answer
    wrong = torch.cumsum((inside & ~right).int(), dim=1)
    closes = inside & (targets == end)
    before = torch.where(last_start > 0, wrong.gather(1, (last_start - 1).clamp(min=0)), 0)
    perfect = closes & (wrong == before)
    return torch.stack([perfect.sum(), closes.sum()])


def check_vocabulary(model: nn.Module, vocab_size: int, seq_len: int, name: str) -> None:
    """A model whose vocabulary or context is smaller than the data's, said before training
    (on the device it would be an index error deep inside the embedding or attention)."""
    model_vocab = getattr(model, "vocab_size", None)
    if model_vocab is not None and model_vocab < vocab_size:
        raise ConfigError(f"model {name} has a vocabulary of {model_vocab} but the token data "
                          f"holds ids up to {vocab_size - 1}: drop model.kwargs.vocab_size "
                          "(the data's vocabulary is used), or pack with the model's tokenizer")
    context = getattr(model, "context", None)
    if context is not None and seq_len > context:
        raise ConfigError(f"data.tokens.seq_len={seq_len} is longer than the context of "
                          f"{name} ({context} tokens): lower data.tokens.seq_len, or set "
                          f"model.kwargs.context={seq_len}")
