"""The model registry and activation checkpointing.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_models.py."""


import pytest
import torch
from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.models.checkpointing import enable_activation_checkpointing
from hpctrain.models.model_names import build_model
from hpctrain.models.small import ResidualBlock


@pytest.mark.parametrize("name", ["torchvision:resnet18", "timm:resnet18", "hpctrain:tiny_cnn",
                                  "resnet_small"])
def test_registry_resolves_each_source_with_num_classes(name):
    model = build_model(name, num_classes=7)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)


@pytest.mark.parametrize("name, message", [
    ("torchvision:resnet51", "torchvision has no model 'resnet51'"),
    ("timm:resnett18", "timm has no model 'resnett18'"),
    ("hpctrain:big", "hpctrain has no model 'big'"),
    ("keras:resnet50", "keras:resnet50 does not import: ModuleNotFoundError: No module "
     "named 'keras'; is it installed"),
])
def test_unknown_models_are_explained(name, message):
    with pytest.raises(ConfigError, match=message):
        build_model(name, num_classes=3)


def test_bad_model_kwargs_are_a_config_error():
    with pytest.raises(ConfigError, match="model.kwargs"):
        build_model("hpctrain:resnet_small", 3, {"depth": 4})


def _block_forward_calls(model, monkeypatch):
    """Run one training step; count ResidualBlock.forward calls (recomputation included:
    module hooks do not fire when the checkpoint recomputes)."""
    calls = []
    original = ResidualBlock.forward
    monkeypatch.setattr(ResidualBlock, "forward",
                        lambda self, x: calls.append(1) or original(self, x))
    model(torch.randn(4, 3, 16, 16)).sum().backward()
    monkeypatch.setattr(ResidualBlock, "forward", original)
    return len(calls)


def test_activation_checkpointing_recomputes_blocks_with_the_same_gradients(monkeypatch):
    torch.manual_seed(0)
    plain = build_model("hpctrain:resnet_small", 5)
    checkpointed = build_model("hpctrain:resnet_small", 5)
    checkpointed.load_state_dict(plain.state_dict())
    enable_activation_checkpointing(checkpointed, "hpctrain:resnet_small")
    assert set(checkpointed.state_dict()) == set(plain.state_dict())  # checkpoints stay compatible
    torch.manual_seed(1)
    plain_calls = _block_forward_calls(plain, monkeypatch)
    torch.manual_seed(1)
    checkpointed_calls = _block_forward_calls(checkpointed, monkeypatch)
    assert checkpointed_calls == 2 * plain_calls  # forward, then recomputed in backward
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def test_activation_checkpointing_uses_timm_and_refuses_blockless_models():
    model = build_model("timm:resnet18", 3)
    enable_activation_checkpointing(model, "timm:resnet18")
    assert model.grad_checkpointing
    with pytest.raises(ConfigError, match="no block of a known type"):
        enable_activation_checkpointing(nn.Sequential(nn.Linear(2, 2)), "mlp")


def test_a_timm_model_of_fixed_input_size_is_built_for_the_data():
    model = build_model("timm:swin_tiny_patch4_window7_224", num_classes=3, image_sizes=(128,))
    assert model.eval()(torch.randn(1, 3, 128, 128)).shape == (1, 3)


@pytest.mark.parametrize("kwargs, sizes, message", [
    ({}, (128, 160), r"takes images of one fixed size \(224 px\), but this recipe feeds it "
                     r"\[128, 160\] px"),
    ({"img_size": 224}, (128,), "model.kwargs.img_size=224 but data.images.image_size=128"),
])
def test_sizes_a_fixed_size_model_cannot_take_are_refused(kwargs, sizes, message):
    with pytest.raises(ConfigError, match=message):
        build_model("timm:vit_tiny_patch16_224", num_classes=3, kwargs=kwargs, image_sizes=sizes)
