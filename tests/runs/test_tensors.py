"""Your own tensors, neither images nor tokens nor point clouds (issue 40): a 16-feature
regression and a 1-D signal classifier train through hpctrain.fit and through a recipe,
the task picked from the samples by fit, the classes from the model's output; each way it
can be wrong is one line (exit 2).

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/cluster/test_tensors.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import hpctrain
from hpctrain.errors import ConfigError, DataError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "tensor_data.py"
sys.path.insert(0, str(FIXTURE.parent))
from tensor_data import (Levels, Linear16, SignalNet, Squares, Tags, Waves, mlp,  # noqa: E402
                         pixel_net)
from recipes import tensor_recipe
from launching import records

QUICK = dict(train={"epochs": 5, "batch_size": 64}, optim={"name": "adamw", "lr": 0.01},
             data={"num_workers": 0}, tensorboard=False, report=False)


@pytest.mark.parametrize("numpy", [False, True])
def test_a_regression_mlp_trains_through_fit_without_naming_its_task(tmp_path, capsys, numpy):
    torch.manual_seed(0)
    summary = hpctrain.fit(mlp(), Linear16(1024, 0, numpy), Linear16(256, 1, numpy),
                           output_dir=str(tmp_path), **QUICK)
    out = capsys.readouterr().out
    assert "task regression: the first training sample has a float target" in out
    assert summary["status"] == "completed" and summary["task"] == "regression"
    assert summary["final_val_r2"] > 0.95 and summary["final_val_mae"] < 0.3
    assert summary["best_val_loss"] == pytest.approx(min(
        r["val_mse"] for r in records(summary["run_dir"], "eval")))
    last = records(summary["run_dir"], "train")[-1]
    assert {"train_mse", "train_mae", "train_r2"} <= set(last) and "train_accuracy" not in last
    assert "final_val_r2" in out  # the summary table shows the task's figures


@pytest.mark.parametrize("as_dict", [False, True])
def test_a_signal_classifier_takes_its_classes_from_the_model(tmp_path, capsys, as_dict):
    """No num_classes anywhere: the model's output width on a validation sample says 4, and
    the banner says where the number came from; a dict sample calls model(**inputs)."""
    torch.manual_seed(0)
    summary = hpctrain.fit(SignalNet(), Waves(1024, 0, as_dict), Waves(256, 1, as_dict),
                           output_dir=str(tmp_path), **QUICK)
    out = capsys.readouterr().out
    assert "task classification: the first training sample has an integer label" in out
    assert "tensors, 4 classes (the model's output width; data.num_classes unset)" in out
    assert summary["task"] == "classification" and summary["final_val_accuracy"] > 0.9


def test_a_multi_label_set_trains_through_fit_scored_by_f1(tmp_path, capsys):
    torch.manual_seed(0)
    summary = hpctrain.fit(mlp(outputs=5), Tags(1024, 0), Tags(256, 1),
                           output_dir=str(tmp_path), **QUICK)
    out = capsys.readouterr().out
    assert "task multilabel_classification: the first training sample has a multi-hot " \
        "target of 5 labels" in out and "tensors, 5 labels each on or off" in out
    assert summary["final_val_f1"] > 0.85 and summary["final_val_exact_match"] > 0.5
    last = records(summary["run_dir"], "eval")[-1]
    assert summary["best_val_loss"] <= last["val_loss"] < 0.3
    hits = last["val_precision"] * last["val_recall"]
    assert last["val_f1"] == pytest.approx(2 * hits / (last["val_precision"]
                                                       + last["val_recall"]))


def test_a_segmentation_of_masks_trains_through_fit_scored_by_miou(tmp_path, capsys):
    """A class for every pixel (some ignored): the classes from the model's output channels."""
    torch.manual_seed(0)
    summary = hpctrain.fit(pixel_net(), Levels(1024, 0), Levels(128, 1),
                           output_dir=str(tmp_path), **{**QUICK, "optim.lr": 0.03})
    out = capsys.readouterr().out
    assert "task segmentation: the first training sample has an integer mask of shape " \
        "(16, 16)" in out
    assert "a class of 3 for every element (the model's output width" in out
    assert summary["final_val_accuracy"] > 0.9 and summary["final_val_miou"] > 0.8
    with pytest.raises(ConfigError, match=r"outputs of shape \(64, 3, 16\) for masks of "
                                          r"shape \(64, 16, 16\)"):
        hpctrain.fit(torch.nn.Sequential(pixel_net(), torch.nn.Flatten(2),
                                         torch.nn.Linear(256, 16)),
                     Levels(256, 0), Levels(64, 1), output_dir=str(tmp_path), **QUICK)


def test_images_without_a_classes_list_take_them_from_your_model(tmp_path, capsys, run_cli):
    """(float image, int) pairs and no `classes`: image classification, 3 classes from the
    model's output. A model of hpctrain's or a library's is built for the number it is given,
    so there the recipe must say it."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(8, 3))
    summary = hpctrain.fit(net, Squares(512, 0), Squares(128, 1), output_dir=str(tmp_path),
                           **QUICK)
    out = capsys.readouterr().out
    assert "images, 3 classes (the model's output width; data.num_classes unset)" in out
    assert summary["task"] == "image_classification" and summary["final_val_accuracy"] > 0.9
    code, _, err = run_cli("run", str(tensor_recipe(tmp_path, "auto", "mlp", "squares")),
                           "model.name=hpctrain:tiny_cnn")
    assert code == 2 and "how many classes? The training dataset has no `classes` list or " \
        "`num_classes`, and model.name hpctrain:tiny_cnn is built for the number it is " \
        "given; set data.num_classes=N" in err


def test_a_model_whose_output_does_not_match_the_targets_is_named(tmp_path):
    """(B, 2) outputs for (B,) targets would broadcast into a (B, B) comparison: refused."""
    with pytest.raises(ConfigError, match=r"outputs of shape \(64, 2\) for targets of shape "
                                          r"\(64,\)"):
        hpctrain.fit(mlp(outputs=2), Linear16(256, 0), Linear16(64, 1),
                     output_dir=str(tmp_path), **QUICK)


def test_a_sample_that_fits_no_task_is_named(tmp_path):
    class Strings(torch.utils.data.Dataset):
        def __len__(self):
            return 128

        def __getitem__(self, index):
            return torch.zeros(16), "positive"

    with pytest.raises(DataError, match=r"train sample 0: its label is a str \('positive'\), "
                                        r"not an integer"):
        hpctrain.fit(mlp(), Strings(), Strings(), output_dir=str(tmp_path), task="classification",
                     **QUICK)


@pytest.mark.parametrize("task, model, dataset, figure, least", [
    ("regression", "mlp", "linear16", "final_val_r2", 0.95),
    ("classification", "SignalNet", "waves", "final_val_accuracy", 0.9),
    ("multilabel_classification", "tagger", "tags", "final_val_f1", 0.85),
    ("segmentation", "pixel_net", "levels", "final_val_miou", 0.8)])
def test_a_recipe_names_the_task_and_trains_your_tensors(tmp_path, run_cli, task, model,
                                                         dataset, figure, least):
    code, out, err = run_cli("run", str(tensor_recipe(tmp_path, task, model, dataset)), "optim.lr="
                             + ("0.03" if task == "segmentation" else "0.01"))
    assert code == 0, err
    summary = json.loads(next((tmp_path / "runs").glob("tensors-*/summary.json")).read_text())
    assert summary["task"] == task and summary[figure] > least


def test_a_recipe_of_your_tensors_says_what_is_missing(tmp_path, run_cli):
    """No model: a task on tensors has no default one. Float targets under task: auto
    (images): the refusal names the task that fits."""
    code, _, err = run_cli("run", str(tensor_recipe(tmp_path, "regression", "mlp", "linear16")),
                           "model.name=auto")
    assert code == 2 and "task regression learns from your own tensors and has no default " \
        "model: set model.name" in err
    code, _, err = run_cli("run", str(tensor_recipe(tmp_path, "auto", "mlp", "linear16")))
    assert code == 2 and "train sample 0: its image is a Tensor of shape (16,)" in err
    assert "set task=regression (a float target)" in err


@pytest.mark.parametrize("task, model, dataset, shape", [
    ("regression", "mlp", "linear16", [16]),
    ("multilabel_classification", "tagger", "tags", [16]),
    ("segmentation", "pixel_net", "levels", [1, 16, 16])])
def test_memory_predicts_a_step_of_your_tensors_and_measures_it(tmp_path, run_cli, task, model,
                                                                dataset, shape):
    """The batch has the first sample's shapes, the loss is the task's; measured on the CPU,
    what autograd holds after forward is what was predicted."""
    code, out, err = run_cli("memory", str(tensor_recipe(tmp_path, task, model, dataset)),
                             "device=cpu", "--gpu-memory", "1GiB", "--measure",
                             "--out", str(tmp_path), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["estimate"]["input_shape"] == shape and report["estimate"]["fits"]
    assert report["estimate"]["breakdown_bytes"]["inputs"] >= 64 * 16 * 4
    assert abs(report["measured"]["relative_error"]) < 0.01


def test_profile_tune_and_submit_take_a_recipe_of_your_tensors(tmp_path, run_cli):
    recipe = str(tensor_recipe(tmp_path, "regression", "mlp", "linear16"))
    code, out, err = run_cli("profile", recipe, "--steps", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["verdict"]["bound"]
    code, out, err = run_cli("tune", recipe, "train.epochs=1", "--space",
                             "optim.lr=loguniform(0.001,0.05)", "--trials", "2", "--dir",
                             str(tmp_path / "search"))
    assert code == 0, err
    assert "best_val_loss (minimize), budget 2 trials; 2 complete" in out  # the task's own
    code, out, err = run_cli("tune", recipe, "train.epochs=1", "--space",
                             "optim.lr=loguniform(0.001,0.05)", "--trials", "1", "--objective",
                             "final_val_r2:max", "--dir", str(tmp_path / "r2"))
    assert code == 0 and "final_val_r2 (maximize), budget 1 trials; 1 complete" in out, err
    code, out, err = run_cli("submit", recipe, "--gpus", "4", "--dry-run")
    assert code == 0, err
    assert f"hpctrain run {recipe}" in out or recipe in out


def test_r2_of_targets_that_do_not_vary_is_refused_not_invented(tmp_path, capsys):
    """R² divides by the targets' spread: for a constant target it is undefined, so the
    figure is left empty (null, "-"), never a number."""
    class Constant(torch.utils.data.Dataset):
        def __len__(self):
            return 128

        def __getitem__(self, index):
            return torch.randn(16), 1.0

    summary = hpctrain.fit(mlp(), Constant(), Constant(), output_dir=str(tmp_path),
                           **{**QUICK, "train": {"epochs": 1, "batch_size": 64}})
    assert summary["status"] == "completed" and summary["final_val_r2"] is None
    assert summary["final_val_mse"] is not None
    assert "val_r2 -" in capsys.readouterr().out
    assert records(summary["run_dir"], "eval")[-1]["val_r2"] is None


def test_a_freeze_pattern_that_matches_nothing_is_one_line(tmp_path, run_cli):
    code, _, err = run_cli("run", str(tensor_recipe(tmp_path, "regression", "mlp", "linear16")),
                           "model.freeze=[encoder.*]")
    assert code == 2 and err.count("\n") == 1
    assert "model.freeze: 'encoder.*' matches no parameter of the model (its parameters " \
           "are named like 0.weight, 0.bias, 2.weight, ..., 2.bias)" in err


def test_the_segmentation_loss_is_torchs_masked_mean_without_its_atomic_reduction():
    """deterministic=true on CUDA refused the loss (nll_loss2d's forward adds its mean with
    atomics; found on an H200). The task's loss asks for every element's loss and sums them
    itself: no reduced nll_loss2d reaches the device, and the value is torch's own mean over
    the elements kept, ignored ones (-100) left out."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hpctrain.tasks.segmentation import IGNORED, segmentation

    class Reductions(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "nll_loss" in str(func) and "backward" not in str(func):
                self.seen.append((str(func), args[3]))  # (input, target, weight, reduction)
            return func(*args, **(kwargs or {}))

    task = segmentation(torch.device("cpu"), 3, "pixel_net")
    logits = torch.randn(4, 3, 8, 8, requires_grad=True)
    masks = torch.randint(0, 3, (4, 8, 8))
    masks[0, :2] = IGNORED
    batch = task.to_device((torch.zeros(4, 1, 8, 8), masks), True)
    with Reductions() as seen:
        value = task.loss(logits, batch)
        value.backward()
    assert seen.seen and all(reduction == 0 for _, reduction in seen.seen), seen.seen
    expected = torch.nn.functional.cross_entropy(logits, masks, ignore_index=IGNORED)
    assert value.item() == pytest.approx(expected.item(), rel=1e-6)
    everything_ignored = task.to_device((torch.zeros(1, 1, 8, 8),
                                         torch.full((1, 8, 8), IGNORED)), True)
    assert task.loss(logits[:1], everything_ignored).item() == 0.0  # torch's mean: nan
