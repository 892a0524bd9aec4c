"""Run directories as hpctrain writes them, and a fleet of five whose usage and race the
runs-index tests compute by hand; an index refreshed from folders."""

import json
import os
import time
from pathlib import Path

from hpctrain.runs.database import open_database
from hpctrain.runs.index import Index
from hpctrain.runs.scan import LOST_AFTER_SECONDS

NOW = time.time()


def noon(day: str) -> float:
    """Mid-day of a date, so the month is the same in every time zone."""
    return time.mktime(time.strptime(f"{day} 12:00", "%Y-%m-%d %H:%M"))


def make_run(root: Path, name: str, user: str, recipe: str, cluster: str, day: str, gpus: int,
             status: str | None, device_hours: float, energy: float | None,
             evals: list[tuple], jobs: tuple = (), heartbeat: float | None = None,
             split: tuple[float, float] | None = None) -> Path:
    """A run directory as hpctrain writes it. evals: (step, metric, value, elapsed seconds,
    device-hours, joules); split: each job's (seconds, training seconds), the rest start-up
    (none: a run of an hpctrain before the split)."""
    run = root / name
    run.mkdir(parents=True)
    started = noon(day)
    (run / "config.yaml").write_text(f"name: {recipe}\ntrain:\n  batch_size: {gpus * 32}\n")
    (run / "run.json").write_text(json.dumps({
        "run_id": f"id-{name}", "name": name, "recipe": recipe, "created": started,
        "user": user, "cluster": cluster, "git_commit": "abc123", "config_hash": "f" * 16,
        "starts": [{"time": started, "job_id": job, "world_size": max(gpus, 1),
                    "hosts": ["n1"], "gpu_model": "NVIDIA A100" if gpus else None,
                    "gpus": gpus, **({"seconds": split[0], "split": {
                        "startup": split[0] - split[1], "training": split[1], "steps": 100}}
                        if split else {})} for job in (jobs or (None,))]}))
    lines = [json.dumps({"kind": "eval", "step": step, "time": started + elapsed, metric: value,
                         "elapsed_seconds": elapsed, "device_hours": hours,
                         "energy_joules": joules})
             for step, metric, value, elapsed, hours, joules in evals]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    if status is not None:
        best = max(v for _, m, v, *_ in evals if m == "val_accuracy") if any(
            e[1] == "val_accuracy" for e in evals) else None
        (run / "summary.json").write_text(json.dumps({
            "status": status, "device_hours": device_hours, "energy_joules": energy,
            "best_val_accuracy": best, "steps": evals[-1][0] if evals else 0,
            "device": "NVIDIA A100" if gpus else "cpu", "world_size": max(gpus, 1),
            "energy_source": "nvml-counter" if energy else "not measured"}))
    beat = heartbeat if heartbeat is not None else started + 3600
    for file in run.iterdir():
        os.utime(file, (beat, beat))
    if status is not None:
        os.utime(run / "summary.json", (beat + 10, beat + 10))
    return run


def refreshed(url: str, *roots: Path) -> Index:
    index = Index(open_database(url))
    index.refresh(list(roots))
    return index


def write_fleet(root: Path) -> Path:
    """Five runs whose usage and race are computed by hand in the tests."""
    make_run(root, "a1", "alice", "resnet", "jz", "2026-10-05", 4, "completed", 2.0, 3.6e6,
             [(100, "val_accuracy", 0.90, 600, 1.0, 1.8e6),
              (200, "val_accuracy", 0.95, 1200, 2.0, 3.6e6)], jobs=("11", "12"),
             split=(900.0, 600.0))  # 2 jobs x 900 s x 4 GPUs: its 2.0 device-hours
    make_run(root, "a2", "alice", "resnet", "jz", "2026-11-02", 8, "completed", 1.0, 7.2e6,
             [(50, "val_accuracy", 0.94, 300, 0.5, 3.6e6),
              (100, "val_accuracy", 0.96, 600, 1.0, 7.2e6)], split=(450.0, 405.0))
    make_run(root, "b1", "bob", "resnet", "grete", "2026-11-10", 4, "failed", 3.0, 1.8e6,
             [(100, "val_accuracy", 0.80, 900, 3.0, 1.8e6)])
    make_run(root, "b2", "bob", "gpt", "grete", "2026-11-12", 0, "completed", 0.5, None,
             [(10, "val_loss", 2.5, 1800, 0.5, None)])
    make_run(root, "b3", "bob", "gpt", "grete", "2026-11-20", 2, None, 0, None,  # killed
             [(10, "val_loss", 3.0, 450, 0.25, 0.9e6)], heartbeat=NOW - 2 * LOST_AFTER_SECONDS)
    return root
