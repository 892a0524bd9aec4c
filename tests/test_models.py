"""The model registry and activation checkpointing."""

import json

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
    ({"img_size": 224}, (128,), "model.kwargs.img_size=224 but data.image_size=128"),
])
def test_sizes_a_fixed_size_model_cannot_take_are_refused(kwargs, sizes, message):
    with pytest.raises(ConfigError, match=message):
        build_model("timm:vit_tiny_patch16_224", num_classes=3, kwargs=kwargs, image_sizes=sizes)


def test_a_run_that_feeds_a_fixed_size_model_several_sizes_is_exit_2(run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny(
        "model.name=timm:swin_tiny_patch4_window7_224", "data.val_image_size=32"))
    assert code == 2 and "takes images of one fixed size" in err and "Traceback" not in err


POINT_CLOUD_FACTORY = '''
from hpctrain.models.pointnet import pointnet_small


def forty(width=0.125):
    return pointnet_small(num_classes=40, width=width)  # ModelNet40's head, on 10 classes
'''


@pytest.mark.parametrize("model, task", [
    ("torchvision.models:resnet18", []),  # torchvision's own factory: **kwargs, no num_classes
    ("{tmp}/forty.py:forty", ["task=point_cloud_classification", "data.dataset=shapes3d",
                              "data.points.num_points=64", "train.batch_size=4"]),
])
def test_a_model_without_the_datas_classes_is_refused_naming_the_setting(
        tmp_path, tiny, run_cli, model, task):
    """Before, a factory that was not handed the data's classes trained a 1,000-way (or
    40-way) head on 10 classes without a word: the loss and the accuracy do not notice."""
    (tmp_path / "forty.py").write_text(POINT_CLOUD_FACTORY)
    model = model.format(tmp=tmp_path)
    args = [*tiny("train.max_steps=2", f"data.shapes3d.cache_dir={tmp_path / 'clouds'}",
                  "data.shapes3d.num_train=16", "data.shapes3d.num_val=10"), *task,
            f"model.name={model}"]
    code, _, err = run_cli("run", "default", *args)
    wrong = 1000 if "torchvision" in model else 40
    assert code == 2 and err.strip().splitlines() == [
        f"hpctrain: error: model.name {model} gives {wrong} outputs per sample, but the data "
        f"has 10 classes: build it for the data's classes (a factory's num_classes "
        f"parameter, or model.kwargs.num_classes=10)"]
    if "torchvision" in model:  # the setting it names is the fix
        code, _, err = run_cli("run", "default", *args, "model.kwargs.num_classes=10")
        assert code == 0, err


LAZY = """
from torch import nn


def build(num_classes=10):
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(num_classes))


def unreached(num_classes=10):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.spare = nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes)), \\
                nn.LazyLinear(3)

        def forward(self, x):
            return self.body(x)
    return Net()
"""


def test_a_model_with_lazy_modules_trains_and_is_counted_after_a_dry_run(tmp_path, run_cli,
                                                                       tiny):
    """nn.LazyLinear is valid torch: its parameters come from a first forward, which
    hpctrain makes on one sample before counting, wrapping or optimising them (issue 51;
    before: a traceback counting an uninitialised parameter for the MFU)."""
    (tmp_path / "lazy.py").write_text(LAZY)
    model = f"model.name={tmp_path / 'lazy.py'}:build"
    code, out, err = run_cli("run", "default", *tiny(model, "train.max_steps=2"))
    assert code == 0, err
    from hpctrain.train.checkpoints.checkpoint import read_checkpoint

    run, = (tmp_path / "runs").iterdir()
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    saved = read_checkpoint(next((run / "checkpoints").glob("step_*")))
    assert saved["model"]["3.weight"].shape == (10, 8 * 14 * 14)  # made from 16 px images
    assert "(0.02 M parameters)" in out  # counted once made: 224 + 15,690
    code, out, err = run_cli("memory", "default", *tiny(model))
    assert code == 0 and "Traceback" not in err, err
    code, _, err = run_cli("run", "default", *tiny(f"model.name={tmp_path / 'lazy.py'}"
                                                   ":unreached"))
    assert code == 2 and err.count("\n") == 1
    assert "the lazy modules spare were not called by a forward on one sample" in err


def test_a_built_in_gpt_of_impossible_or_enormous_shape_is_one_line(tmp_path, run_cli):
    """model.kwargs.layers NaN or heads 0 (a ZeroDivisionError) are refused naming the
    field; 1,000 layers of width 2^20 are counted on the meta device and do not fit
    (exit 3), where building them was an allocation traceback (issue 51)."""
    import resource
    import subprocess
    import sys

    recipe = [f"output_dir={tmp_path / 'runs'}", f"data.arithmetic.cache_dir={tmp_path}",
              "data.arithmetic.num_train=200", "data.arithmetic.num_val=20",
              "data.tokens.seq_len=32", "train.batch_size=4", "data.num_workers=0"]
    for change, words in (("model.kwargs.layers=.nan", "layers nan is not a whole number"),
                          ("model.kwargs.heads=0", "heads 0 is not a whole number")):
        code, _, err = run_cli("run", "tiny-lm", *recipe, change)
        assert code == 2 and err.count("\n") == 1 and words in err, err
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "run", "tiny-lm", *recipe,
         "model.kwargs.layers=1000", "model.kwargs.width=1048576"],
        capture_output=True, text=True, timeout=300, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_AS, (8 << 30, 8 << 30)))
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "model.name hpctrain:gpt_tiny: 13,194,144,065,257,472 parameters" in done.stderr
