"""The model registry and activation checkpointing: the tests that train, in this process or in
an `hpctrain` process of their own (the others are tests/unit/test_models.py)."""

import json

import pytest

from warm_starts import AddressSpaceLimit


def test_a_run_that_feeds_a_fixed_size_model_several_sizes_is_exit_2(run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny(
        "model.name=timm:swin_tiny_patch4_window7_224", "data.images.val_image_size=32"))
    assert code == 2 and "takes images of one fixed size" in err and "Traceback" not in err


POINT_CLOUD_FACTORY = '''
from hpctrain.data.points.pointnet import pointnet_small


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
        capture_output=True, text=True, timeout=300, preexec_fn=AddressSpaceLimit(8 << 30))
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "model.name hpctrain:gpt_tiny: 13,194,144,065,257,472 parameters" in done.stderr


def test_a_model_larger_than_the_address_space_limit_leaves_is_one_line_naming_the_limit(
        tmp_path):
    """7 GiB of parameters where this host has more free but the process may map only 4 GiB
    (`ulimit -v`, as some clusters set on login nodes and in jobs): counted on the meta device
    and refused, exit 3, naming the limit (before: a MemoryError traceback, exit 70)."""
    import subprocess
    import sys

    from hpctrain.monitor.host_memory import room

    assert room().bytes > 8 << 30, "the test needs a host with more than 8 GiB free"
    recipe = [f"output_dir={tmp_path / 'runs'}", f"data.arithmetic.cache_dir={tmp_path}",
              "data.arithmetic.num_train=200", "data.arithmetic.num_val=20",
              "data.tokens.seq_len=32", "train.batch_size=4", "data.num_workers=0",
              "model.kwargs.layers=4", "model.kwargs.width=6144", "model.kwargs.heads=8"]
    done = subprocess.run([sys.executable, "-m", "hpctrain", "run", "tiny-lm", *recipe],
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=AddressSpaceLimit(4 << 30))
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "GiB of memory the process's address-space limit (ulimit -v 4.0 GiB" in \
        done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
