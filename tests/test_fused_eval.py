"""train.fuse_eval: the folded model computes what the unfolded one does, follows the live
weights from one evaluation to the next, leaves training alone, and a run's evaluations agree
with and without it."""

import json

import torch
import torchvision
from torch import nn

from hpctrain.train.validation.fused_eval import fold


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.normal_(0, 0.2)  # statistics a trained model would have
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.normal_(0, 0.1)
    return model


@torch.no_grad()
def test_a_folded_resnet_computes_the_same_and_follows_the_live_weights():
    model = _resnet()
    folded = fold(model)
    assert folded.describe() == "20 conv + batch-norm pairs folded for evaluation"
    assert model.training and all(m.training for m in model.modules())  # training untouched
    x = torch.randn(4, 3, 64, 64)
    evaluated = folded.module().eval()
    assert not any(isinstance(m, nn.BatchNorm2d) for m in evaluated.modules())
    torch.testing.assert_close(evaluated(x), model.eval()(x), rtol=1e-4, atol=1e-4)
    model.layer1[0].bn1.running_mean.add_(0.5)  # training moves statistics and weights
    model.conv1.weight.mul_(1.1)
    model.fc.weight.add_(0.01)
    torch.testing.assert_close(folded.module()(x), model(x), rtol=1e-4, atol=1e-4)


def test_what_cannot_be_folded_says_why():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)

        def forward(self, x):
            return self.bn(self.conv(x)) if x.sum() > 0 else x  # data-dependent

    assert fold(Branchy()).startswith("torch.fx cannot trace the model")
    assert fold(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.BatchNorm2d(8))) == \
        "no batch-norm follows a convolution directly"
    assert fold(nn.Linear(3, 3)) == "the model has no BatchNorm2d to fold"


def _evaluations(tiny_config, *overrides):
    from hpctrain.train.bookkeeping import Clock
    from hpctrain.train.build import build_parts
    from hpctrain.train.loop import Progress, _run_steps
    from hpctrain.train.preemption import Stopper
    from hpctrain.train.telemetry import Telemetry

    parts = build_parts(tiny_config("train.max_steps=6", "train.eval_every_epochs=0.5",
                                    "precision=fp32", *overrides))
    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed))
    telemetry.close()
    lines = (parts.run_dir / "metrics.jsonl").read_text().splitlines()
    return parts, [r for r in map(json.loads, lines) if r["kind"] == "eval"]


def test_a_run_evaluates_the_same_with_and_without_folding(tiny_config):
    fused, with_folding = _evaluations(tiny_config, "train.fuse_eval=true")
    plain, without = _evaluations(tiny_config, "train.fuse_eval=false")
    assert fused.fused_eval is not None and plain.fused_eval is None
    assert len(with_folding) == len(without) >= 2  # each evaluation refolds the new weights
    for a, b in zip(with_folding, without):
        assert a["val_accuracy"] == b["val_accuracy"] and a["eval_seconds"] > 0
    images, _ = next(iter(fused.data.val_loader))
    inputs = fused.task.to_device((images, torch.zeros(len(images))), False).inputs
    with torch.no_grad():  # the trained weights and statistics, folded and not
        torch.testing.assert_close(fused.fused_eval.module().eval()(inputs),
                                   fused.model.eval()(inputs), rtol=1e-4, atol=1e-4)
    auto, _ = _evaluations(tiny_config)  # auto folds all 4 of the tiny CNN's pairs
    assert auto.fused_eval.describe() == "4 conv + batch-norm pairs folded for evaluation"
