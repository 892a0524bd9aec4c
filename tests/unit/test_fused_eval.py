"""train.fuse_eval: the folded model computes what the unfolded one does, follows the live
weights from one evaluation to the next, leaves training alone, and a run's evaluations agree
with and without it.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_fused_eval.py."""


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
