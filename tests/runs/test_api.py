"""hpctrain.fit and hpctrain.load_config: a model and datasets from a script, trained on the
same engine and into the same run directory as `hpctrain run`; each bad input explained.
(The example script under torchrun, preemption and resume=auto: test_examples.py.)

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_api.py, tests/cluster/test_api.py."""

from __future__ import annotations


import pytest
import torch
import yaml
from torch import nn

import hpctrain
from hpctrain import user_code
from hpctrain.errors import ConfigError, DataError
from levels import Levels


def tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 3))


def settings(tmp_path) -> dict:
    return {"output_dir": str(tmp_path / "runs"), "tensorboard": False,
            "data": {"images": {"image_size": 16}, "num_workers": 0},
            "train": {"epochs": 2, "global_batch_size": 20, "log_every": 3}}


def test_fit_trains_the_model_it_is_given_into_a_run_directory(tmp_path, capsys, run_cli,
                                                               monkeypatch):
    model = tiny_net()
    before = [p.detach().clone() for p in model.parameters()]
    summary = hpctrain.fit(model, Levels(200, 0), **settings(tmp_path), run_name="levels")
    out = capsys.readouterr().out
    # no val_data: a tenth of the training set is held out
    assert "data given:Levels (180 train / 20 val images, 3 classes" in out
    assert summary["status"] == "completed" and summary["steps"] == 2 * 180 // 20
    assert summary["best_val_accuracy"] > 0.5
    run = tmp_path / "runs" / "levels"
    assert summary["run_dir"] == str(run) and (run / "metrics.jsonl").exists()
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["model"]["name"] == "given:Sequential"
    assert recorded["data"]["dataset"] == "given:Levels"
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), \
        "the model handed in holds the trained weights"
    # in another process the recorded configuration cannot make the model again, and says
    # which script can
    monkeypatch.setattr(user_code, "_given", {})
    code, _, err = run_cli("run", str(run / "config.yaml"), "run_name=again")
    assert code == 2 and "model.name: given:Sequential was handed to hpctrain.fit()" in err


def test_fit_evaluates_on_the_validation_set_it_is_given_with_a_recipe_s_settings(tmp_path,
                                                                                  capsys):
    """A recipe for an image folder, its model and data replaced by the ones given (its
    data.path is then not needed, its model.kwargs not passed)."""
    summary = hpctrain.fit(tiny_net(), Levels(100, 0), Levels(30, 1), "small-images",
                           **settings(tmp_path), run_name="recipe")
    assert "(100 train / 30 val images" in capsys.readouterr().out
    assert summary["effective_lr"] == pytest.approx(0.4 * 20 / 512)  # the recipe's scaling
    recorded = yaml.safe_load((tmp_path / "runs" / "recipe" / "config.yaml").read_text())
    assert recorded["name"] == "small-images" and recorded["model"]["kwargs"] == {}


@pytest.mark.parametrize("call, error, message", [
    (lambda: hpctrain.fit(lambda x: x, Levels(10, 0)), ConfigError,
     "fit(model=...): a torch.nn.Module, not a function"),
    (lambda: hpctrain.fit(tiny_net(), 5), ConfigError,
     "fit(train_data=...): a torch.utils.data.Dataset or DataLoader, not a int"),
    (lambda: hpctrain.fit(tiny_net(), Levels(10, 0), train={"epoch": 3}), ConfigError,
     "train.epoch"),
    (lambda: hpctrain.load_config(overrides="train.epochs=3"), ConfigError,
     "give a list of key=value strings"),
    (lambda: hpctrain.fit(tiny_net(), Levels(10, 0).as_stream()), ConfigError,
     "fit(): train_data is a stream (an IterableDataset), which has no samples to hold out"),
    (lambda: hpctrain.fit(tiny_net(), Levels(40, 0), Levels(20, 1, bad_index=10),
                          data={"num_workers": 0}),
     DataError, "data.dataset: given:Levels: val sample 10: its image is a ndarray of shape "
                "(16, 16, 1)"),
])
def test_fit_explains_bad_input(tmp_path, monkeypatch, call, error, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=None) as raised:
        call()
    assert message in str(raised.value)
    assert raised.value.exit_code == 2
