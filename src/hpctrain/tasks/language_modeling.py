"""Language modelling: next-token prediction. Loss per token, perplexity, token accuracy,
the share of padding, and, where the data marks answers (`answer` = (start id, end id): the
tokens after start up to and including end), the share of answers predicted entirely right.

torch is imported when the task is built, never when a recipe is read (`spec.py`).
"""

from __future__ import annotations

import math

from hpctrain.errors import ConfigError
from hpctrain.tasks.spec import Curve, Measured, TaskSetup, TaskSpec

IGNORE = -100  # a target position that is padding: cross_entropy's ignore_index


def language_modeling(device, answer: tuple[int, int] | None):
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor

    from hpctrain.tasks.steps import Batch, Task

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

    def loss(logits, batch: Batch):
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(),
                               ignore_index=IGNORE)

    def sums(logits, batch: Batch, loss, training: bool):
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

    return Task(SPEC.name, SPEC.unit,
                ("loss_sum", "right", "tokens", "positions", "answers_right", "answers"),
                "tokens", to_device, loss, sums, values)


def _target_and_best(logits, targets):
    """Each position's score of its target and its highest score. Logits split over the
    vocabulary (loss parallelism: a DTensor sharded on its last dimension) are never
    gathered: each rank scores the targets in its share (the others -inf) and takes its
    maximum, and the ranks' maxima are taken."""
    import torch
    from torch.distributed.tensor import DTensor

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


def answer_sums(inputs, targets, right, answer: tuple[int, int]):
    """[answers entirely right, answers] in a batch, on the device.

    The answer of a row's problem is every target after an input `start` token up to the target
    `end` token. For each target that ends an answer, its span's wrong predictions are counted
    as the difference of a running count of wrong answer tokens at its end and just before its
    start. An answer cut off by the end of a row is not counted."""
    import torch

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


def check_vocabulary(model, vocab_size: int, config) -> None:
    """A model whose vocabulary or context is smaller than the data's, said before training
    (on the device it would be an index error deep inside the embedding or attention)."""
    name, seq_len = config.model.name, config.data.tokens.seq_len
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


def build(setup: TaskSetup):
    return language_modeling(setup.device, setup.answer)


def describe(config, num_classes: int | None, vocab_size: int | None) -> str:
    tokens = config.data.tokens
    return f"{tokens.batching} of up to {tokens.seq_len} tokens, vocabulary {vocab_size:,}"


def figures(measured: Measured) -> dict:
    best_loss = measured.best_val_loss
    return {"images_per_second": None,  # summary.json has the key for every task
            "tokens_per_second": measured.units_per_second,
            "best_val_loss": best_loss,
            "best_val_perplexity": math.exp(min(best_loss, 700.0)) if best_loss is not None
            else None,
            "final_eval": measured.final_eval,
            "padding_fraction": measured.padding_fraction,
            "parameters": measured.parameters,
            "mfu": measured.mfu, "mfu_peak": measured.mfu_peak,
            "mfu_formula": measured.mfu_formula}


def tokens_per_sample(config) -> int:
    return config.data.tokens.seq_len


def flops_per_token(model_flops, config) -> float:
    """PaLM's 6N + 12LHQT at the recipe's sequence length (train/hardware/mfu.py)."""
    return model_flops.per_token(config.data.tokens.seq_len)


SPEC = TaskSpec(name="language_modeling", data_kind="tokens", unit="tokens",
                objective="best_val_loss:min", default_model="hpctrain:gpt_mini",
                curves=(Curve("perplexity", "validation perplexity", "eval", "val_perplexity"),),
                figures=figures, rate_label="tok", sample_size="data.tokens.seq_len",
                build=build, describe=describe, check_model=check_vocabulary,
                units_per_sample=tokens_per_sample, flops_per_unit=flops_per_token,
                fit_defaults={"optim.name": "adamw", "optim.lr": 3e-4,
                              "optim.betas": [0.9, 0.95], "optim.weight_decay": 0.1,
                              "optim.grad_clip_norm": 1.0})
