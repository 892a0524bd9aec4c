"""hpctrain.fit and hpctrain.load_config: a model and datasets from a script, trained on the
same engine and into the same run directory as `hpctrain run`; each bad input explained.
(The example script under torchrun, preemption and resume=auto: test_examples.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

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
            "data": {"image_size": 16, "num_workers": 0},
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


def test_load_config_takes_sections_dotted_keys_and_command_line_overrides(tmp_path):
    config = hpctrain.load_config(overrides=["train.epochs=5", "precision=fp32"],
                                  train={"epochs": 3, "batch_size": 8}, precision="bf16",
                                  **{"optim.lr": 0.01})
    assert config.train.epochs == 5 and config.precision == "fp32"  # the command line wins
    assert config.train.batch_size == 8 and config.optim.lr == 0.01
    # hpctrain's own defaults, not the shapes recipe of `hpctrain run`
    assert config.schedule.name == "cosine" and config.data.dataset == "shapes"
    recipe = hpctrain.load_config("default", train={"batch_size": 8})
    assert recipe.name == "default" and recipe.train.batch_size == 8
    assert recipe.train.global_batch_size is None  # a per-device batch replaces the global one


def test_a_run_is_named_after_the_running_script(monkeypatch):
    from hpctrain.api import _script_name

    script = types.ModuleType("__main__")
    script.__file__ = "/home/me/train cifar.py"
    monkeypatch.setitem(sys.modules, "__main__", script)
    assert _script_name() == "train-cifar"
    assert hpctrain.load_config().name == "train-cifar"
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # a notebook
    assert _script_name() == "fit"


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


RANK_SEEDED = '''
import os, sys
import torch
from torch import nn
import hpctrain
from levels import Levels

out = sys.argv[1]
torch.manual_seed(int(os.environ["RANK"]))  # a different initialisation in each process
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(8, 3))
torch.save(model.state_dict(), f"{out}/init-{os.environ['RANK']}.pt")
hpctrain.fit(model, Levels(40, 0), Levels(20, 1), output_dir=out, run_name="fsdp",
             tensorboard=False, parallel={"strategy": "fsdp"},
             optim={"name": "sgd", "lr": 1e-12, "momentum": 0, "weight_decay": 0},
             data={"image_size": 16, "num_workers": 0},
             train={"max_steps": 1, "global_batch_size": 20})
'''


@pytest.mark.distributed
def test_under_fsdp_every_process_trains_rank_0_s_initial_weights(tmp_path):
    """Each process of a script builds its own model; unseeded, they differ. FSDP shards
    without syncing: hpctrain gives every rank rank 0's weights first (DDP does it itself)."""
    import torch.distributed.checkpoint as dcp

    from hpctrain.runs.directory import list_checkpoints

    script = tmp_path / "rank_seeded.py"
    script.write_text(RANK_SEEDED)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), str(tmp_path)], capture_output=True, text=True, timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1",
             "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                            os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    first, second = (torch.load(tmp_path / f"init-{rank}.pt") for rank in (0, 1))
    assert any(not torch.equal(first[k], second[k]) for k in first)
    [checkpoint] = list_checkpoints(tmp_path / "fsdp" / "checkpoints")
    state = {"model": {k: torch.empty_like(v) for k, v in first.items()}}
    dcp.load(state, checkpoint_id=checkpoint)
    for name, trained in state["model"].items():
        assert torch.allclose(trained, first[name], atol=1e-6), name
