"""Where a pipeline cuts the blocks: the balanced split against every possible one, and the
costs it balances, measured on a real GPT."""

import itertools
import random
from types import SimpleNamespace

import pytest

from hpctrain.models.gpt import gpt
from hpctrain.parallel import pipeline
from hpctrain.parallel.stage_split import balanced, parameter_costs


def largest(costs, first, last, counts):
    ends = [0, *itertools.accumulate(counts)]
    stages = [sum(costs[a:b]) for a, b in zip(ends, ends[1:])]
    stages[0] += first
    stages[-1] += last
    return max(stages)


@pytest.mark.parametrize("seed", range(20))
def test_the_balanced_split_is_the_best_of_all_splits(seed):
    rng = random.Random(seed)
    n, stages = rng.randint(2, 9), rng.randint(1, 4)
    stages = min(stages, n)
    costs = [rng.uniform(0.5, 3) for _ in range(n)]
    first, last = rng.uniform(0, 6), rng.uniform(0, 6)
    counts = balanced(costs, first, last, stages)
    assert len(counts) == stages and sum(counts) == n and min(counts) >= 1
    every = [c for c in itertools.product(range(1, n + 1), repeat=stages) if sum(c) == n]
    assert largest(costs, first, last, counts) == pytest.approx(
        min(largest(costs, first, last, c) for c in every))


def test_equal_blocks_split_equally_and_heavy_ends_take_fewer():
    assert balanced([1.0] * 8, 0, 0, 4) == [2, 2, 2, 2]
    assert balanced([1.0] * 12, 2.5, 2.5, 4) == [2, 4, 4, 2]  # 4.5 at most, not 5.5


def test_a_large_vocabulary_weighs_on_the_end_stages():
    """GPT blocks of width 64 hold 49 k parameters; a 4,096-word embedding 262 k, as much as
    five blocks: the first and the last stage (which holds the output layer's copy) get
    one block each of 8."""
    model = gpt("tiny", vocab_size=4096, width=64, layers=8, heads=4)
    first, last, tokens = pipeline._ends(model, pipeline.GPT_FAMILY)
    costs, before, after = parameter_costs(list(model.blocks.values()), first, last, tokens)
    assert before == pytest.approx(4096 * 64) and after > before
    counts = pipeline.stage_blocks(model, "parameters", 3, None, None)
    assert counts[0] == 1 and counts[-1] == 1 and sum(counts) == 8


def test_the_time_split_measures_each_block_on_a_micro_batch():
    model = gpt("tiny", vocab_size=4096, width=64, layers=4, heads=4)
    config = SimpleNamespace(data=SimpleNamespace(tokens=SimpleNamespace(seq_len=32)))
    alone = SimpleNamespace(is_main=True, broadcast=lambda obj: obj)
    counts = pipeline.stage_blocks(
        model, "time", 2, lambda: pipeline.sample_inputs(model, config, 4, "cpu"), alone)
    assert sum(counts) == 4 and min(counts) >= 1
    assert all(p.grad is None for p in model.parameters())  # the timing leaves no gradients
