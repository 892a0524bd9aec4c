"""LR scaling, schedules, parameter groups and the optimiser choices."""

import math

import pytest
import torch
from timm.optim import Lamb, Lars

from hpctrain.config import OptimConfig, ScheduleConfig
from hpctrain.models.model_names import build_model
from hpctrain.train.optimizers.optim import build_optimizer, lr_multiplier, param_groups, scaled_lr


@pytest.mark.parametrize("rule, expected", [("none", 0.1), ("linear", 0.4), ("sqrt", 0.2)])
def test_lr_scales_with_the_global_batch(rule, expected):
    optim = OptimConfig(lr=0.1, lr_scaling=rule, reference_batch_size=256)
    assert scaled_lr(optim, 1024) == pytest.approx(expected)


def test_warmup_then_cosine_reaches_the_floor():
    schedule = ScheduleConfig(name="cosine", warmup_epochs=2, min_lr_ratio=0.1)
    lr = [lr_multiplier(schedule, s, total_steps=100, steps_per_epoch=10) for s in range(100)]
    assert lr[0] == pytest.approx(0.05) and lr[19] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(lr[:20], lr[1:20]))  # rising warmup
    assert all(a >= b for a, b in zip(lr[20:], lr[21:]))   # then falling
    assert lr[99] == pytest.approx(0.1, abs=0.01)


def test_warmup_in_steps_is_the_same_rise_counted_in_steps():
    """schedule.warmup_steps (issue 53): the user of Accelerate counts warmup in steps; the
    rise is the same whatever the epoch's length, and one warmup is given, not two."""
    schedule = ScheduleConfig(name="cosine", warmup_steps=20, min_lr_ratio=0.1)
    by_epochs = ScheduleConfig(name="cosine", warmup_epochs=2, min_lr_ratio=0.1)
    for steps_per_epoch in (10, 7):
        lr = [lr_multiplier(schedule, s, 100, steps_per_epoch) for s in range(100)]
        assert lr[0] == pytest.approx(0.05) and lr[19] == pytest.approx(1.0)
    assert [lr_multiplier(schedule, s, 100, 10) for s in range(100)] == \
        [lr_multiplier(by_epochs, s, 100, 10) for s in range(100)]
    with pytest.raises(ValueError, match="give the warmup once: schedule.warmup_steps=20 or "
                                         "schedule.warmup_epochs=1.0, not both"):
        ScheduleConfig(warmup_steps=20, warmup_epochs=1)


def test_step_and_onecycle_shapes():
    step = ScheduleConfig(name="step", milestones=[2, 4], gamma=0.1)
    assert [lr_multiplier(step, s, 60, 10) for s in (0, 19, 20, 40)] == \
        pytest.approx([1, 1, 0.1, 0.01])
    cycle = ScheduleConfig(name="onecycle", pct_start=0.25)
    lr = [lr_multiplier(cycle, s, 100, 10) for s in range(100)]
    assert lr.index(max(lr)) == 25 and lr[0] < 0.1 and lr[-1] < 0.01


def test_norm_and_bias_parameters_get_no_weight_decay():
    model = build_model("hpctrain:tiny_cnn", 3)
    decay, no_decay = param_groups(model, 5e-4, no_decay_norm_bias=True)
    assert all(p.ndim > 1 for p in decay["params"]) and decay["weight_decay"] == 5e-4
    assert all(p.ndim <= 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0
    assert len(param_groups(model, 5e-4, no_decay_norm_bias=False)) == 1


@pytest.mark.parametrize("name, kind", [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW),
                                        ("lars", Lars), ("lamb", Lamb)])
def test_each_optimiser_trains(name, kind):
    torch.manual_seed(0)
    model = build_model("hpctrain:tiny_cnn", 3)
    optimizer = build_optimizer(model, OptimConfig(name=name, nesterov=True), 0.01,
                                torch.device("cpu"))
    assert isinstance(optimizer, kind)
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 3, (16,))
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and math.isfinite(losses[-1])


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_a_step_the_fp16_loss_scaler_skips_leaves_the_gpu_optimiser_untouched(name):
    """The optimiser built for a GPU (fused kernels run on the CPU too) meets an overflowed
    first step: the scaler skips it, and the next good step moves the weights as it would have
    without the overflow (torch's fused SGD filled its momentum from uninitialised memory)."""
    from hpctrain.train.hardware.precision import Precision

    def two_steps(overflow: bool) -> torch.Tensor:
        weight = torch.nn.Parameter(torch.ones(4))
        optim = OptimConfig(name=name, momentum=0.9, nesterov=True, weight_decay=0.0)
        optimizer = build_optimizer(torch.nn.ParameterList([weight]), optim, 0.1,
                                    torch.device("cuda"))
        precision = Precision("fp16", torch.device("cpu"))
        for step in ([float("inf"), 1.0] if overflow else [1.0]):
            precision.backward((weight * step).sum())
            precision.step(optimizer, [weight], clip_norm=None)
            optimizer.zero_grad()
        return weight.detach()

    assert torch.equal(two_steps(overflow=True), two_steps(overflow=False))


def test_weight_ema_follows_the_weights_at_its_decay():
    from hpctrain.train.optimizers.optim import WeightEma

    model = build_model("hpctrain:tiny_cnn", 3)
    ema = WeightEma(model, decay=0.75)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.state_dict()["stem.1.num_batches_tracked"].fill_(7)
    ema.update()
    for key, value in ema.state_dict().items():
        if value.is_floating_point() and key in dict(model.named_parameters()):
            torch.testing.assert_close(value, start[key] + 0.25)
    assert ema.state_dict()["stem.1.num_batches_tracked"].item() == 7
