"""examples/: each runs as its README says, on data the test writes (a few steps each)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from launching import launch, one_thread_env, wait_for

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


@pytest.fixture(scope="module")
def csv_data(tmp_path_factory) -> Path:
    """PNGs of three grey levels (the classes), listed in train.csv and val.csv."""
    root = tmp_path_factory.mktemp("csv-data")
    (root / "images").mkdir()
    rng = np.random.default_rng(0)
    for split, count in (("train", 96), ("val", 24)):
        rows = []
        for index in range(count):
            label = index % 3
            pixels = np.clip(40 + 80 * label + rng.normal(0, 10, (20, 20, 3)), 0, 255)
            name = f"images/{split}-{index}.png"
            Image.fromarray(pixels.astype(np.uint8)).save(root / name)
            rows.append(f"{name},{label}\n")
        (root / f"{split}.csv").write_text("".join(rows))
    return root


def csv_overrides(data: Path, out: Path, name: str) -> list[str]:
    return [f"data.path={data}", f"output_dir={out}", f"run_name={name}",
            "data.images.image_size=16", "train.global_batch_size=16", "train.epochs=2",
            "train.log_every=1", "tensorboard=false"]


def train_losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def run_fit_script(nproc: int, data: Path, overrides: list[str], timeout: float = 240):
    """examples/csv_images/fit_csv.py as a user runs it: python, or torchrun with the script
    as the entry point."""
    script = str(EXAMPLES / "csv_images" / "fit_csv.py")
    launcher = [sys.executable] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return subprocess.run([*launcher, script, str(data), *overrides], capture_output=True,
                          text=True, timeout=timeout, env=one_thread_env())


@pytest.mark.distributed
def test_the_csv_example_trains_alike_as_a_recipe_and_a_fit_script_on_one_or_two_processes(
        csv_data, tmp_path):
    """The recipe on 1 process and on 2 (DDP), and fit_csv.py (hpctrain.fit, the same
    settings) under 2-process torchrun with FSDP: the same training, step for step."""
    recipe = str(EXAMPLES / "csv_images" / "recipe.yaml")
    for nproc, name in ((1, "one"), (2, "two")):
        done = launch(nproc, [*csv_overrides(csv_data, tmp_path, name),
                              "data.num_workers=2" if nproc == 1 else "data.num_workers=1"],
                      recipe=recipe)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    done = run_fit_script(2, csv_data, [*csv_overrides(csv_data, tmp_path, "fit"),
                                        "data.num_workers=1", "parallel.strategy=fsdp"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.count("best validation accuracy") == 1  # rank 0 only
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["steps"] == 2 * 96 // 16 and summary["final_val_accuracy"] > 0.5
    fitted = yaml.safe_load((tmp_path / "fit" / "config.yaml").read_text())
    assert fitted["model"]["name"] == "given:SmallNet" and fitted["name"] == "fit_csv"
    assert fitted["data"]["dataset"] == "given:CsvImages"
    one, two, fit = (train_losses(tmp_path / name) for name in ("one", "two", "fit"))
    assert len(one) == len(two) == len(fit) == 12
    assert one == pytest.approx(two, abs=1e-5) and one == pytest.approx(fit, abs=1e-5)


def test_a_fit_script_stops_on_a_preemption_signal_with_75_and_resume_auto_finishes_it(
        csv_data, tmp_path):
    """Preemption and resume=auto for a script as for `hpctrain run`: the run found again is
    the script's own (named after it), its given model restored from the checkpoint."""
    overrides = [f"output_dir={tmp_path}", "data.images.image_size=16",
                 "train.global_batch_size=16", "tensorboard=false", "data.num_workers=0",
                 "train.log_every=2"]
    script = str(EXAMPLES / "csv_images" / "fit_csv.py")
    process = subprocess.Popen([sys.executable, script, str(csv_data), *overrides,
                                "train.max_steps=100000"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any('"train"' in metrics.read_text()
                         for metrics in tmp_path.glob("fit_csv-*/metrics.jsonl")), process)
    process.send_signal(signal.SIGUSR1)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 75, err[-3000:]
    assert "SIGUSR1 received" in err and "resume=auto" in err
    [run] = tmp_path.glob("fit_csv-*")
    stopped = json.loads((run / "summary.json").read_text())
    assert stopped["status"] == "preempted" and 0 < stopped["steps"] < 100000
    done = run_fit_script(1, csv_data, [*overrides, f"train.max_steps={stopped['steps'] + 3}",
                                        "resume=auto"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "resuming" in done.stdout and [run] == list(tmp_path.glob("fit_csv-*"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["restarts"] == 1
    assert summary["steps"] == stopped["steps"] + 3


@pytest.mark.slurm
def test_a_fit_script_runs_under_srun_on_two_nodes(slurm_cluster, csv_data, tmp_path):
    """The script is the entry point under srun as under torchrun: one task per node, each
    finds its rank and the rendezvous from Slurm's variables."""
    script = EXAMPLES / "csv_images" / "fit_csv.py"
    command = " ".join([sys.executable, str(script), str(csv_data), f"output_dir={tmp_path}",
                        "run_name=srun", "data.images.image_size=16", "train.global_batch_size=16",
                        "train.max_steps=6", "tensorboard=false", "data.num_workers=0"])
    log = tmp_path / "job.out"
    job = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1",
                          f"--chdir={tmp_path}", "-o", str(log), "--wrap", f"srun {command}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + 300
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)  # (sbatch --wait polls at growing intervals: 30 s more here)
    assert (tmp_path / "srun" / "summary.json").exists(), log.read_text()[-3000:]
    summary = json.loads((tmp_path / "srun" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 6
    assert log.read_text().count("best validation accuracy") == 1  # rank 0 only
