"""Whole runs through the CLI: the run-directory contract, telemetry and the failure paths."""

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import write_image_folder

from hpctrain.runs.directory import list_checkpoints
from hpctrain.train import build
from hpctrain.train.checkpoints.checkpoint import read_checkpoint

SUMMARY_KEYS = {"status", "best_val_accuracy", "final_val_accuracy", "images_per_second",
                "data_wait_fraction", "peak_memory_bytes", "wall_seconds", "steps", "epochs",
                "device", "world_size", "precision", "device_hours", "global_batch_size"}


def only_run(tmp_path) -> Path:
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1
    return runs[0]


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_run_fills_the_run_directory(tmp_path, run_cli, tiny):
    code, out, _ = run_cli("run", "default", *tiny("tensorboard=true", "train.epochs=2",
                                                   "checkpoint.keep_last=1",
                                                   "optim.lr_scaling=linear",
                                                   "optim.reference_batch_size=32"))
    assert code == 0
    run = only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["status"] == "completed" and summary["steps"] == 20 == 2 * 160 // 16
    assert summary["epochs"] == 2 and summary["world_size"] == 1 and summary["precision"] == "fp32"
    assert 0 <= summary["best_val_accuracy"] <= 1 and 0 <= summary["final_val_accuracy"] <= 1
    assert summary["best_val_accuracy"] >= summary["final_val_accuracy"]
    assert 0 <= summary["data_wait_fraction"] <= 1
    assert summary["images_per_second"] > 0 and summary["peak_memory_bytes"] > 0
    assert summary["effective_lr"] == pytest.approx(0.2 * 16 / 32)
    assert summary["device_hours"] == pytest.approx(summary["wall_seconds"] / 3600)
    assert "best_val_accuracy" in out and "images_per_second" in out  # the closing table
    records = read_metrics(run)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == list(range(2, 21, 2))
    assert [r["step"] for r in evals] == [10, 20]
    assert max(r["lr"] for r in train) <= summary["effective_lr"] + 1e-9
    assert all(0 <= r["data_wait_fraction"] <= 1 and r["images_per_second"] > 0 for r in train)
    assert (run / "config.yaml").exists() and list((run / "tb").glob("events.out.tfevents.*"))
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_00000020"]
    # who, where, which configuration: run.json, written at the start
    identity = json.loads((run / "run.json").read_text())
    assert len(identity["run_id"]) == 32 and identity["recipe"] == "default"
    assert len(identity["config_hash"]) == 16 and identity["user"]
    (start,) = identity["starts"]
    assert start["world_size"] == 1 and start["gpus"] == 0 and start["launcher"] == "single"
    # energy: this machine has no GPU; RAPL where readable, else said, never made up
    assert summary["energy_source"] in ("rapl", "not measured")
    if summary["energy_source"] == "not measured":
        assert summary["energy_joules"] is None and summary["samples_per_joule"] is None
    assert summary["gpu_utilization_mean"] is None


def test_gradient_accumulation_sets_the_global_batch(tmp_path, run_cli, tiny):
    code, _, _ = run_cli("run", "default", *tiny("train.grad_accum_steps=2", "--json"))
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert code == 0 and summary["global_batch_size"] == 32 and summary["steps"] == 160 // 32


def test_ema_is_evaluated(tmp_path, run_cli, tiny):
    code, _, _ = run_cli("run", "default", *tiny("optim.ema.enabled=true"))
    evals = [r for r in read_metrics(only_run(tmp_path)) if r["kind"] == "eval"]
    assert code == 0 and evals and all(0 <= r["val_accuracy_ema"] <= 1 for r in evals)


def test_the_ema_evaluated_is_the_average_of_the_weights_by_hand(tiny_config):
    """Oracle: after every step, ema <- decay * ema + (1 - decay) * weights, from the weights
    as built, kept here by hand; the run's EMA weights are those, and its val_accuracy_ema is
    the hand-made average's own accuracy."""
    from hpctrain.train.bookkeeping import Clock
    from hpctrain.train.loop import Progress, _run_steps
    from hpctrain.train.preemption import Stopper
    from hpctrain.train.telemetry import Telemetry
    from hpctrain.train.validation.evaluation import evaluate

    decay = 0.8
    parts = build.build_parts(tiny_config("optim.ema.enabled=true", f"optim.ema.decay={decay}",
                                          "train.max_steps=6"))
    floats = {k for k, v in parts.model.state_dict().items() if v.is_floating_point()}
    by_hand = {k: v.detach().clone() for k, v in parts.model.state_dict().items()}

    def average(parts, step):
        for key, value in parts.model.state_dict().items():
            by_hand[key] = decay * by_hand[key] + (1 - decay) * value if key in floats \
                else value.clone()

    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed), average)
    telemetry.close()
    kept = parts.step.ema.module.state_dict()
    for key in floats:
        torch.testing.assert_close(kept[key], by_hand[key])
    hand_made = copy.deepcopy(parts.model)
    hand_made.load_state_dict(by_hand)
    last = [r for r in read_metrics(parts.run_dir) if r["kind"] == "eval"][-1]
    assert last["step"] == 6
    assert last["val_accuracy_ema"] == pytest.approx(evaluate(parts, hand_made)["val_accuracy"])


def test_a_loss_that_stays_nan_stops_and_keeps_the_last_good_checkpoint(tmp_path, run_cli,
                                                                         tiny):
    code, _, err = run_cli("run", "default", *tiny("optim.lr=1e30", "train.epochs=4",
                                                   "checkpoint.every_steps=1",
                                                   "train.nan_patience=2"))
    assert code == 1
    assert "NaN/inf at every step since step" in err and "optim.lr" in err
    assert "Last good checkpoint" in err and "Traceback" not in err
    run = only_run(tmp_path)
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    kept = list_checkpoints(run / "checkpoints")
    for path in kept:
        weights = read_checkpoint(path)["model"]
        assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())
    assert (kept[-1].name in err) if kept else ("none saved yet" in err)


def test_out_of_memory_names_the_batch_and_the_switches(tmp_path, run_cli, tiny, monkeypatch):
    """CUDA cannot run here: the model raises the error CUDA would raise."""
    class Exhausting(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def forward(self, x):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(build, "build_model", lambda *a, **k: Exhausting())
    code, _, err = run_cli("run", "default", *tiny("train.batch_size=16"))
    assert code == 1 and "out of memory at step 0 with train.batch_size=16" in err
    assert "train.batch_size=8 train.grad_accum_steps=2" in err
    assert "model.activation_checkpointing=true" in err and "precision=bf16" in err


def folder_with_a_bad_image(tmp_path, bad: str, content: bytes) -> Path:
    root = tmp_path / "data"
    write_image_folder(root / "train", per_class=16)
    write_image_folder(root / "val", per_class=4)
    (root / "train" / bad).write_bytes(content)
    return root


def test_unreadable_images_are_skipped_and_counted(tmp_path, run_cli, tiny):
    root = folder_with_a_bad_image(tmp_path, "cat/0.jpg", b"not a jpeg")
    code, _, err = run_cli("run", "default", *tiny("data.dataset=imagefolder",
                                                   f"data.path={root}"))
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert code == 0 and summary["skipped_images"] >= 1
    assert "skipping unreadable image" in err and "0.jpg" in err


def test_unreadable_images_fail_when_asked(tmp_path, run_cli, tiny):
    root = folder_with_a_bad_image(tmp_path, "dog/3.jpg", b"")
    code, _, err = run_cli("run", "default", *tiny("data.dataset=imagefolder",
                                                   f"data.path={root}", "data.num_workers=1",
                                                   "data.images.on_bad_image=fail"))
    assert code == 2 and "unreadable image" in err and "3.jpg" in err
    assert "data.images.on_bad_image=skip" in err and "Traceback" not in err


@pytest.mark.parametrize("setup, message", [
    ("missing", "does not exist"),
    ("empty", "has no class sub-folders"),
])
def test_missing_or_empty_dataset_folder(tmp_path, run_cli, tiny, setup, message):
    root = tmp_path / "data"
    if setup == "empty":
        root.mkdir()
    code, _, err = run_cli("run", "default", *tiny("data.dataset=imagefolder",
                                                   f"data.path={root}", "data.val_fraction=0.2"))
    assert code == 2 and message in err and str(root) in err
    assert not (tmp_path / "runs").exists()  # a run that cannot start leaves nothing behind


def test_a_batch_larger_than_the_dataset_is_explained(run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny("train.batch_size=1000"))
    assert code == 2 and "fewer than one batch" in err


def test_synthetic_data_trains(tmp_path, run_cli, tiny):
    code, _, _ = run_cli("run", "default", *tiny("data.dataset=synthetic",
                                                 "data.synthetic.num_train=64",
                                                 "data.synthetic.num_val=16",
                                                 "data.synthetic.num_classes=5"))
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert code == 0 and summary["steps"] == 4


def test_version_names_hpctrain_torch_and_python_without_importing_torch():
    import subprocess
    import sys
    from importlib.metadata import version

    from hpctrain.version import __version__
    probe = ("import sys; from hpctrain import cli\n"
             "try:\n    cli.main(['--version'])\nexcept SystemExit as end:\n"
             "    print('torch' in sys.modules, end.code)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    python = ".".join(map(str, sys.version_info[:3]))
    assert done.stdout.splitlines() == [
        f"hpctrain {__version__} (torch {version('torch')}, Python {python})", "False 0"]
