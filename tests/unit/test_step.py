"""The training step (train/step.py): gradients accumulated over micro-batches are the large
batch's, the hook before the forward pass sees the moved batch and hands the forward its
result, and `hpctrain memory` runs the same step as the engine, region for region."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from hpctrain.memory.simulate import StepSpec, run_steps
from hpctrain.profiling.names import PREFIX
from hpctrain.tasks.steps import Batch
from hpctrain.train.hardware.precision import Precision
from hpctrain.train.step import Step, take_step

CPU = torch.device("cpu")


def _mean_squared_error(outputs, batch: Batch) -> torch.Tensor:
    return ((outputs - batch.targets) ** 2).mean()


def _linear_step(model: nn.Module, accumulate: int = 1, loss=_mean_squared_error,
                 **extra) -> Step:
    """A step on `model` (mean squared error unless told), SGD at learning rate 0.1."""
    return Step(model=model, params=list(model.parameters()),
                to_device=lambda pair: Batch(pair[0], pair[1], pair[1]), loss=loss,
                precision=Precision("fp32", CPU),
                optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                accumulate=accumulate, **extra)


def test_micro_batches_accumulated_give_the_large_batch_s_update():
    """Oracle: the mean loss over 8 rows has the gradient of the mean of two 4-row means,
    so two micro-batches of 4 must move the weights as one batch of 8 does."""
    torch.manual_seed(0)
    inputs, targets = torch.randn(8, 5), torch.randn(8, 3)
    whole = nn.Linear(5, 3)
    halves = copy.deepcopy(whole)
    take_step(_linear_step(whole), iter([(inputs, targets)]).__next__)
    pieces = iter([(inputs[:4], targets[:4]), (inputs[4:], targets[4:])])
    take_step(_linear_step(halves, accumulate=2), pieces.__next__)
    for a, b in zip(whole.parameters(), halves.parameters()):
        torch.testing.assert_close(a, b)
    assert all(p.grad is None for p in halves.parameters())  # set to None after the update


def test_the_hook_before_the_forward_gets_the_moved_batch_and_the_forward_its_result():
    """Where context parallelism would keep its rank's part of a sequence: the forward
    pass, the loss and the figures see what the hook returned."""
    model, seen = nn.Linear(4, 2), {}

    def keep_first_half(batch: Batch) -> Batch:
        seen["moved"] = batch.inputs.shape
        return Batch(batch.inputs[:, :3, :], batch.targets[:, :3, :], batch.labels)

    def record(outputs, batch, loss):
        seen["outputs"], seen["targets"] = outputs.shape, batch.targets.shape

    step = _linear_step(model, before_forward=keep_first_half)
    take_step(step, iter([(torch.randn(2, 6, 4), torch.randn(2, 6, 2))]).__next__,
              record=record)
    assert seen == {"moved": (2, 6, 4), "outputs": (2, 3, 2), "targets": (2, 3, 2)}


def _regions(run) -> list[str]:
    """The step's regions, in the order the profiler saw them start."""
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        run()
    events = sorted((e for e in recorded.events() if e.name.startswith(PREFIX)),
                    key=lambda e: e.time_range.start)
    return [e.name[len(PREFIX):] for e in events]


def test_memory_runs_the_engine_s_step_region_for_region():
    """`hpctrain memory` counts the step the engine trains: the same regions in the same
    order, from one step function (a second copy of the step would drift silently)."""
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    batches = [(torch.randn(4, 6), torch.randint(0, 3, (4,)))] * 2
    engine = _linear_step(copy.deepcopy(model), accumulate=2,
                          loss=lambda outputs, batch: nn.functional.cross_entropy(
                              outputs, batch.targets))
    engine_regions = _regions(lambda: take_step(engine, iter(batches).__next__))

    spec = StepSpec(build_model=lambda: copy.deepcopy(model),
                    make_batch=lambda rows, device: batches[0],
                    build_optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                    criterion=nn.functional.cross_entropy, precision="fp32", target="cpu")
    simulated = spec.build_model()
    memory_regions = _regions(lambda: run_steps(spec, simulated, spec.build_optimizer(
        simulated), 4, CPU, steps=1))
    micro = ["data_wait", "h2d_copy", "forward", "backward"]
    assert engine_regions == micro * 2 + ["optimizer"]
    assert memory_regions == micro + ["optimizer"]
