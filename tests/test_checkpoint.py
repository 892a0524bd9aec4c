"""Atomic checkpoints, resume=auto, and resumed runs that end bitwise equal."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from hpctrain.train import checkpoint as ckpt
from hpctrain.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint

DETERMINISTIC = ("deterministic=true", "train.epochs=10", "checkpoint.every_steps=5",
                 "checkpoint.keep_last=30", "data.num_workers=1", "optim.ema.enabled=true")


def test_keep_last_and_stray_temporary_files(tmp_path):
    (tmp_path / ".step_00000009.pt.tmp123").write_bytes(b"partial")
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, {"w": torch.tensor([step])}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003.pt",
                                                            "step_00000004.pt"]
    assert load_checkpoint(list_checkpoints(tmp_path)[-1])["w"].item() == 4


def test_a_failed_write_never_replaces_a_good_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, {"w": torch.tensor([1])}, keep_last=3)

    def crash(obj, handle):
        handle.write(b"half a checkpoint")
        raise OSError("disk quota exceeded")
    monkeypatch.setattr(ckpt.torch, "save", crash)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 2, {"w": torch.tensor([2])}, keep_last=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001.pt"]
    assert load_checkpoint(tmp_path / "step_00000001.pt")["w"].item() == 1


def test_loading_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "step_00000001.pt"
    torch.save({"evil": print}, path)
    with pytest.raises(Exception, match="[Ww]eights only"):
        load_checkpoint(path)


def final_state(run_dir):
    return load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])


def assert_same_training_state(a, b):
    assert a["step"] == b["step"]
    for part in ("model", "ema"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), f"{part}.{key} differs"
    for key, state in a["optimizer"]["state"].items():
        assert torch.equal(state["momentum_buffer"],
                           b["optimizer"]["state"][key]["momentum_buffer"])
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]


def test_resume_from_a_mid_epoch_checkpoint_ends_bitwise_equal(tmp_path, run_cli, tiny):
    overrides = tiny(*DETERMINISTIC)
    assert run_cli("run", "default", *overrides, "run_name=full")[0] == 0
    full = tmp_path / "runs" / "full"
    resumed = tmp_path / "runs" / "resumed"
    shutil.copytree(full, resumed)
    for path in list_checkpoints(resumed / "checkpoints"):
        if int(path.stem.split("_")[1]) > 15:  # 10 steps per epoch: 15 is mid-epoch
            path.unlink()
    (resumed / "summary.json").unlink()
    code, out, _ = run_cli("run", "default", *overrides, "run_name=resumed", "resume=auto")
    assert code == 0 and "resuming step_00000015.pt" in out
    assert_same_training_state(final_state(full), final_state(resumed))
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 100


@pytest.mark.slow
def test_a_killed_run_resumed_ends_bitwise_equal(tmp_path, run_cli, tiny):
    overrides = tiny(*DETERMINISTIC)
    assert run_cli("run", "default", *overrides, "run_name=reference")[0] == 0
    run_dir = tmp_path / "runs" / "killed"
    process = subprocess.Popen([sys.executable, "-m", "hpctrain", "run", "default", *overrides,
                                "run_name=killed"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "step_00000010.pt").exists():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (run_dir / "summary.json").exists(), "the run finished before it was killed"
    killed_at = list_checkpoints(run_dir / "checkpoints")[-1]
    assert int(killed_at.stem.split("_")[1]) < 100
    code, out, _ = run_cli("run", "default", *overrides, "run_name=killed", "resume=auto")
    assert code == 0 and f"resuming {killed_at.name}" in out
    assert_same_training_state(final_state(tmp_path / "runs" / "reference"),
                               final_state(run_dir))


def test_resume_auto_continues_the_newest_run_and_is_idempotent(tmp_path, run_cli, tiny):
    code, out, _ = run_cli("run", "default", *tiny("resume=auto"))
    assert code == 0 and "resuming" not in out  # nothing to continue: a fresh run
    first = next((tmp_path / "runs").iterdir())
    code, out, _ = run_cli("run", "default", *tiny("resume=auto"))
    assert code == 0 and f"run {first} (resuming step_00000010.pt)" in out
    assert len(list((tmp_path / "runs").iterdir())) == 1  # no new directory
    assert json.loads((first / "summary.json").read_text())["steps"] == 10


def test_resume_errors_and_run_name_collisions(tmp_path, run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny(f"resume={tmp_path / 'nowhere'}"))
    assert code == 2 and "no checkpoint there" in err
    assert run_cli("run", "default", *tiny("run_name=mine"))[0] == 0
    code, _, err = run_cli("run", "default", *tiny("run_name=mine"))
    assert code == 2 and "already holds checkpoints" in err and "resume=auto" in err
