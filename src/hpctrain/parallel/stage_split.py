"""Where a pipeline cuts the blocks: equal runs, or runs balanced by parameters or time.

Equal runs leave the first stage the embedding and the last the output layer on top of their
blocks: with a large vocabulary the ends hold several blocks' worth of weights (a 50,304-word
embedding of width 768 is five GPT-2 blocks), and the last stage computes the output layer and
the loss. `parameters` counts what each block and each end holds; `time` measures each
block's forward and backward, and the ends', on this device with a micro-batch of the run's
shape (rank 0 measures, every rank takes its split). Either way the blocks are cut into the
consecutive runs whose largest stage costs least (a small dynamic programme).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn


def balanced(costs: Sequence[float], first: float, last: float, stages: int) -> list[int]:
    """Blocks per stage, consecutive and at least one each, minimising the largest stage's
    cost; `first` and `last` add to the first and the last stage (what they hold besides
    blocks). Where several splits reach that cost, the first the search meets."""
    n = len(costs)
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)

    def stage_cost(start: int, end: int, index: int) -> float:
        extra = (first if index == 0 else 0.0) + (last if index == stages - 1 else 0.0)
        return prefix[end] - prefix[start] + extra

    # best[s][i]: the least largest cost of cutting the first i blocks into s stages
    best = [[float("inf")] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], stage_cost(j, i, s - 1))
                if value < best[s][i] - 1e-12 * max(1.0, value):
                    best[s][i], cut[s][i] = value, j
    counts, end = [], n
    for s in range(stages, 0, -1):
        counts.append(end - cut[s][end])
        end = cut[s][end]
    return counts[::-1]


def parameter_costs(blocks: list[nn.Module], first: list[nn.Module],
                    last: list[nn.Module], first_tensors=()) -> tuple[list[float], float, float]:
    """(each block's, the first stage's extra, the last stage's extra) parameter counts."""
    def count(modules) -> float:
        return float(sum(p.numel() for m in modules if m is not None for p in m.parameters()))
    return ([count([b]) for b in blocks],
            count(first) + sum(t.numel() for t in first_tensors), count(last))


def time_costs(blocks: list[nn.Module], embed: Callable, head: Callable,
               inputs: torch.Tensor, rounds: int = 3) -> tuple[list[float], float, float]:
    """(each block's, the embedding's, the head's) seconds of forward plus backward on
    `inputs` (one micro-batch), the median of `rounds` after one warm-up."""
    stream = embed(inputs).detach()
    first = _seconds(lambda: embed(inputs), rounds)
    costs = []
    for block in blocks:
        costs.append(_seconds(lambda b=block, x=stream: b(x.requires_grad_()), rounds))
        with torch.no_grad():
            stream = block(stream)
    last = _seconds(lambda: head(stream.detach().requires_grad_()), rounds)
    return costs, first, last


def _seconds(forward: Callable, rounds: int) -> float:
    def once() -> float:
        _sync()
        start = time.perf_counter()
        out = forward()
        out.float().mean().backward()
        _sync()
        return time.perf_counter() - start
    once()
    return statistics.median(once() for _ in range(rounds))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
