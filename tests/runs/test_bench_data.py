"""hpctrain bench data: the tests that train, in this process or in an `hpctrain` process of
their own (the others are tests/unit/test_bench_data.py)."""

import json
import subprocess
import sys

from hpctrain.bench.data_path import DataBench, Setting
from hpctrain.data.images.image_packing import PackOptions, pack


def test_the_report_measures_loader_decoding_and_model(run_cli, tiny):
    code, out, err = run_cli("bench", "data", "default", *tiny(), "--workers", "1,2",
                             "--prefetch", "2", "--seconds", "0.5", "--model",
                             "--model-steps", "4", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert [(s["num_workers"], s["prefetch_factor"]) for s in report["settings"]] == \
        [(1, 2), (2, 2)]
    assert all(s["samples_per_second"] > 0 for s in report["settings"])
    assert report["best"]["samples_per_second"] == max(
        s["samples_per_second"] for s in report["settings"])
    assert report["decoder"] == "pil" and report["decode_one_core"] > 0
    assert report["ratio"] == report["best"]["samples_per_second"] / report["ceiling"]
    assert report["model_samples_per_second"] > 0
    recommended = report["recommended"]
    assert report["advice"][0].startswith(
        f"use data.num_workers={recommended['num_workers']} data.prefetch_factor=2")
    assert report["advice"][1].startswith(("the loader keeps up", "the loader would starve"))


def test_a_packed_recipe_reports_its_decoder(image_folder, tmp_path, run_cli, tiny):
    pack(image_folder, tmp_path / "p", PackOptions(), workers=1, log=lambda *_: None)
    code, out, err = run_cli("bench", "data", "default", *tiny(
        "data.dataset=shards", f"data.path={tmp_path / 'p'}", "train.batch_size=8"),
        "--workers", "1", "--prefetch", "2", "--seconds", "0.3")
    assert code == 0, err
    assert "decode only, one core (simplejpeg)" in out and "<- best" in out
    assert "of the decode limit" in out


def bench(loader: float, model: float | None, dataset="imagefolder", ratio=0.9) -> DataBench:
    best = Setting(4, 2, loader)
    return DataBench("r", dataset, "image", 64, 224, 8, 1, "pil", 500.0, [best], best, best,
                     loader / ratio, ratio, model, None if model is None else
                     max(0.0, 1 - loader / model))


def test_bench_data_python_samples_the_workers_or_profiles_in_process(tmp_path, run_cli, tiny,
                                                                      monkeypatch):
    """py-spy follows the two workers from outside; without it, cProfile sees the same work
    done in this process and says that transport is not measured."""
    from conftest import write_image_folder
    from hpctrain.bench import python_profile

    photos = write_image_folder(tmp_path / "photos", per_class=16, size=320)  # decoding shows
    pack(photos, tmp_path / "p", PackOptions(), workers=1, log=lambda *_: None)
    recipe = ["default", *tiny("data.dataset=shards", f"data.path={tmp_path / 'p'}",
                               "data.val_fraction=0.25", "train.batch_size=4",
                               "data.images.image_size=64"),
              "--workers", "2", "--prefetch", "2", "--seconds", "1", "--python"]
    # a child started before, as a session fixture's server is under pytest: not a worker
    busy = subprocess.Popen([sys.executable, "-c", "import time\nwhile True:\n"
                             " sum(range(200_000)); time.sleep(0.01)"])  # on a CPU 1/4 of it
    try:
        code, out, err = run_cli("bench", "data", *recipe, "--json")
    finally:
        busy.kill()
        busy.wait(5)
    assert code == 0, err
    sampled = json.loads(out)["python"]
    assert sampled["tool"] == "py-spy" and sampled["note"] is None
    roles = {p["pid"]: p["role"] for p in sampled["processes"]}
    assert list(roles.values())[0] == "training process"
    assert list(roles.values()).count("worker") == 2 and roles[busy.pid] == "other process"
    workers = [p for p in sampled["processes"] if p["role"] == "worker"]
    assert all(p["stages"]["decoding"] > 0.2 for p in workers), workers
    monkeypatch.setattr(python_profile, "py_spy_available", lambda: None)
    code, out, err = run_cli("bench", "data", *recipe)
    assert code == 0, err
    assert "inside the processes (cProfile, 1 s): py-spy is not installed" in out
    assert "transport is not measured" in out and "hottest in training process" in out
