"""A LightningModule on hpctrain's engine (issue 40, item 3): the tests that start several
processes or a server (torchrun, Slurm, PostgreSQL, the browser, the model hub) (the others
are tests/runs/test_lightning.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest


FIXTURE = Path(__file__).parent.parent / "fixtures" / "lit_classifier.py"
sys.path.insert(0, str(FIXTURE.parent))
from recipes import lit_recipe
from launching import one_thread_env
from launching import records as records_of


def _gathers_run(folder: Path, processes: int, strategy: str) -> tuple:
    """The Gathers module's recipe run by `processes` processes (torchrun on gloo): its loss
    curve, last evaluation and last epoch record."""
    recipe = lit_recipe(folder, "train: {epochs: 1, global_batch_size: 32, log_every: 1}")
    recipe.write_text(recipe.read_text().replace(":LitClassifier", ":Gathers"))
    command = [sys.executable, "-m", "hpctrain", "run", str(recipe),
               f"parallel.strategy={strategy}", f"run_name=p{processes}"]
    if processes > 1:
        command[1:3] = ["-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={processes}", "-m", "hpctrain"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env=one_thread_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    run = folder / "runs" / f"p{processes}"
    return ([r["loss"] for r in records_of(run, "train")], records_of(run, "eval")[-1],
            records_of(run, "epoch")[-1])


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple:
    """The one-process run both strategies are held against (made once)."""
    return _gathers_run(tmp_path_factory.mktemp("one"), 1, "auto")


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_train_the_module_as_one(tmp_path, strategy, one_process):
    """The global batch split over two torchrun processes on gloo, DDP or FSDP wrapping the
    module: the loss curve and the validation figures of one process; self.all_gather
    gathers from every process (one on one); the epoch's figures are reduced over both."""
    curves = {1: one_process, 2: _gathers_run(tmp_path, 2, strategy)}
    assert curves[2][0] == pytest.approx(curves[1][0], rel=1e-4)
    for key in ("val_loss", "val_acc"):
        assert curves[2][1][key] == pytest.approx(curves[1][1][key], rel=1e-4), key
    assert (curves[1][1]["ranks_seen"], curves[2][1]["ranks_seen"]) == (1, 2)
    # the epoch's figures over the epoch and both processes (as with sync_dist)
    assert (curves[1][2]["rank_mean"], curves[2][2]["rank_mean"]) == (0, 0.5)
    assert curves[2][2]["train_loss_mean"] == pytest.approx(curves[1][2]["train_loss_mean"],
                                                            rel=1e-4)


@pytest.mark.slurm
def test_on_slurm_a_preempted_job_requeues_and_ends_as_an_uninterrupted_one(
        slurm_cluster, home, tmp_path):
    """The module's recipe submitted to the test's Slurm cluster, two processes on two nodes:
    SIGUSR1 (what --signal=USR1@lead sends before the time limit) saves, the job requeues
    itself, and it ends with the figures of a job that was never stopped."""
    from hpctrain.cluster import slurm
    from hpctrain.cluster.jobs import submit

    epochs = 10  # 160 steps: the stop comes after 16 (two records), with 144 steps to spare
    recipe = str(lit_recipe(tmp_path, f"train: {{epochs: {epochs}, batch_size: 16, log_every: 8}}"))
    reference, preempted = (submit(recipe, [f"run_name={name}"], gpus=2, nodes=2,
                                   time_limit="10") for name in ("straight", "preempted"))
    metrics = preempted.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 2):
        assert time.monotonic() < deadline and preempted.state in ("PENDING", "RUNNING")
        time.sleep(0.2)
    slurm.cancel(preempted.id, signal="USR1")
    assert reference.wait(timeout=300, poll=0.2) == "COMPLETED"
    assert preempted.wait(timeout=300, poll=0.2) == "COMPLETED", preempted.logs(err=True)[-3000:]
    assert "SIGUSR1 received" in preempted.logs(err=True)
    ours, theirs = (json.loads((job.run_dir / "summary.json").read_text())
                    for job in (preempted, reference))
    assert ours["restarts"] == 1 and ours["steps"] == theirs["steps"] == epochs * 16
    assert ours["final_val_loss"] == pytest.approx(theirs["final_val_loss"], rel=1e-5)
