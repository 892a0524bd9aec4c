"""Your own tensors, neither images nor tokens nor point clouds (issue 40): the tests that
start several processes or a server (torchrun, Slurm, PostgreSQL, the browser, the model
hub) (the others are tests/runs/test_tensors.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


FIXTURE = Path(__file__).parent.parent / "fixtures" / "tensor_data.py"
sys.path.insert(0, str(FIXTURE.parent))
from recipes import tensor_recipe
from launching import one_thread_env, records


@pytest.mark.distributed
def test_two_processes_train_a_regression_as_one(tmp_path):
    """The global batch split over two torchrun processes on gloo: the same samples per step,
    so the same loss curve; MSE, MAE and R² from sums added over the ranks, as one process
    counts them."""
    recipe = tensor_recipe(tmp_path, "regression", "mlp", "linear16", "schedule: {name: constant}")
    figures = {}
    for processes in (1, 2):
        command = [sys.executable, "-m", "hpctrain", "run", str(recipe),
                   "train.global_batch_size=64", "train.epochs=2", f"run_name=p{processes}"]
        if processes > 1:
            command[1:3] = ["-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={processes}", "-m", "hpctrain"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                              env=one_thread_env())  # as torchrun sets
        assert done.returncode == 0, done.stderr[-2000:]
        figures[processes] = records(str(tmp_path / "runs" / f"p{processes}"), "eval")[-1]
    for key in ("val_mse", "val_mae", "val_r2"):
        assert figures[2][key] == pytest.approx(figures[1][key], rel=1e-3), key


@pytest.mark.distributed
def test_a_trainer_script_trains_on_two_processes_with_batches_by_length(tmp_path):
    """Issue 67: a Hugging Face Trainer script moved to fit (a datasets.Dataset with a text
    column, group_by_length, compute_metrics) on two torchrun processes: batches by length
    (data.bucketing), compute_metrics over the whole validation set gathered from both."""
    script = FIXTURE.parent / "hf_trainer_script.py"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script), str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300, env=one_thread_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data.bucketing: batches of similar lengths" in done.stdout
    run = next((tmp_path / "runs").iterdir())
    last = records(run, "eval")[-1]
    assert last["val_rows"] == 100  # both ranks' rows, the sampler's repeats left out
    assert last["val_accuracy"] > 0.9
