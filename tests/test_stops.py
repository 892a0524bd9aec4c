"""A stop at any moment: the run is complete only once its final weights are evaluated, an
evaluation a stop cuts short is done after the resume, and metrics.jsonl tells each scheduled
evaluation once, in step order.

The stop comes from inside the run (fixtures/signalling.py: the n-th sample drawn sends the
signal), so its moment is exact: during the first, a middle or the final evaluation, or during
a training step."""

import json
from pathlib import Path

import pytest
import torch

from hpctrain.runs.directory import list_checkpoints
from hpctrain.train.checkpoint import read_checkpoint

SIGNALLING = f"{Path(__file__).parent / 'fixtures' / 'signalling.py'}:stripes_signalling"
STEPS_PER_EPOCH = 320 // 16
VAL = 200  # samples per evaluation
CHECKED = 3  # samples drawn from each split by the check before training (user_datasets.py)


def stripes(tiny, name: str, *extra: str) -> list[str]:
    """A 3-epoch run of the stripes set (an evaluation per epoch: steps 20, 40 and 60)."""
    return [o for o in tiny(f"run_name={name}", "train.epochs=3", "train.log_every=5",
                            "data.image_size=8", "data.num_workers=0")
            if not o.startswith("data.shapes")] + [f"data.dataset={SIGNALLING}", *extra]


def evaluations(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "eval"]


def final_weights(run: Path) -> dict:
    return read_checkpoint(list_checkpoints(run / "checkpoints")[-1])["model"]


@pytest.fixture
def undisturbed(tmp_path, tiny, run_cli):
    code, _, err = run_cli("run", "default", *stripes(tiny, "undisturbed"))
    assert code == 0, err
    run = tmp_path / "runs" / "undisturbed"
    return json.loads((run / "summary.json").read_text()), final_weights(run), evaluations(run)


@pytest.mark.parametrize("signal", ["SIGTERM", "SIGUSR1"])
def test_a_stop_during_the_final_evaluation_leaves_the_run_to_the_resume(
        tmp_path, tiny, run_cli, undisturbed, signal):
    """Before: exit 0, "completed", and the figures of the evaluation before (0.51 where the
    final weights score 0.99); resume=auto then left it so."""
    summary, weights, _ = undisturbed
    run = tmp_path / "runs" / "final"
    args = stripes(tiny, "final", f"data.kwargs.signal={signal}")
    code, _, err = run_cli("run", "default", *args, f"data.kwargs.at={CHECKED + 2 * VAL + 3}")
    assert code == 75, err
    assert "stopped at step 60" in err and "during its evaluation" in err
    stopped = json.loads((run / "summary.json").read_text())
    assert stopped["status"] == "preempted" and stopped["steps"] == 60
    assert [r["step"] for r in evaluations(run)] == [20, 40]
    assert list_checkpoints(run / "checkpoints")[-1].name == "step_00000060"

    code, out, err = run_cli("run", "default", *args, "resume=auto")
    assert code == 0, err
    assert "the evaluation a stop cut short, done now" in out
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["restarts"] == 1
    assert resumed["final_val_accuracy"] == summary["final_val_accuracy"] > 0.9
    assert resumed["best_val_accuracy"] == summary["best_val_accuracy"]
    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]
    assert all(torch.equal(weights[k], v) for k, v in final_weights(run).items())

    code, out, _ = run_cli("run", "default", *args, "resume=auto")  # now it is complete
    assert code == 0 and "already complete" in out
    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]


@pytest.mark.parametrize("split, at, stopped_at", [
    ("val", CHECKED + 3, 20),  # during the first evaluation
    ("val", CHECKED + VAL + 150, 40),  # late in a middle one
    ("train", CHECKED + 16 * 45 + 5, 46),  # during a training step (step 46's batch)
])
def test_every_scheduled_evaluation_is_recorded_once_in_step_order_whatever_the_stop(
        tmp_path, tiny, run_cli, undisturbed, split, at, stopped_at):
    summary, weights, scheduled = undisturbed
    run = tmp_path / "runs" / "moment"
    args = stripes(tiny, "moment", f"data.kwargs.split={split}")
    code, _, err = run_cli("run", "default", *args, f"data.kwargs.at={at}")
    assert code == 75 and f"stopped at step {stopped_at}" in err, err
    code, _, err = run_cli("run", "default", *args, "resume=auto")
    assert code == 0, err
    recorded = evaluations(run)
    assert [r["step"] for r in recorded] == [r["step"] for r in scheduled] == [20, 40, 60]
    assert [r["val_accuracy"] for r in recorded] == [r["val_accuracy"] for r in scheduled]
    assert json.loads((run / "summary.json").read_text())["final_val_accuracy"] == \
        summary["final_val_accuracy"]
    assert all(torch.equal(weights[k], v) for k, v in final_weights(run).items())


def test_ctrl_c_during_the_final_evaluation_is_interrupted_not_completed(tmp_path, tiny,
                                                                         run_cli):
    """SIGINT (Ctrl-C) stops at once: no new checkpoint, exit 130, the resume trains the
    steps since the last checkpoint again and evaluates the final weights."""
    run = tmp_path / "runs" / "ctrl-c"
    args = stripes(tiny, "ctrl-c", "data.kwargs.signal=SIGINT")
    code, _, err = run_cli("run", "default", *args, f"data.kwargs.at={CHECKED + 2 * VAL + 3}")
    assert code == 130 and "interrupted" in err
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    assert list_checkpoints(run / "checkpoints")[-1].name == "step_00000040"
    code, _, err = run_cli("run", "default", *args, "resume=auto")
    assert code == 0, err
    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
