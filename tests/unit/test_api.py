"""hpctrain.fit and hpctrain.load_config: the tests that need no training run, no process and
no server (the others are tests/runs/test_api.py, tests/cluster/test_api.py)."""

from __future__ import annotations

import sys
import types


import hpctrain


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
