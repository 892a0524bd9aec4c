"""Trackers as sinks of the run's one telemetry stream, with the real libraries: the tests that
need no training run, no process and no server (the others are tests/runs/test_trackers.py)."""

import sys

import pytest



def test_a_missing_tracker_library_is_exit_2_with_the_pip_command(run_cli, tiny,
                                                                  monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: import refused
    code, _, err = run_cli("run", "default", *tiny("tracking.sinks=[tensorboard,wandb]"))
    assert code == 2 and "pip install 'hpctrain[wandb]'" in err


@pytest.mark.parametrize("given, sinks", [("tensorboard=false", []),
                                          ("tensorboard=true", ["tensorboard"])])
def test_the_tensorboard_shorthand_sets_the_sinks(tiny_config, given, sinks):
    assert tiny_config("tracking.sinks=[mlflow]", given).tracking.sinks == \
        sinks + ["mlflow"]
