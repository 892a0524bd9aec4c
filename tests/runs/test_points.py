"""Point clouds: the tests that train, in this process or in an `hpctrain` process of their own
(the others are tests/unit/test_points.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpctrain.data.points.modelnet import read_modelnet
from hpctrain.data.points.pointnet import pointnet_small
from point_files import POINT_RUN, points_cache, write_off_folders


# ---- ModelNet's layouts ----------------------------------------------------------------------


def write_hdf5(root: Path, points: np.ndarray | None = None, labels=None) -> Path:
    """PointNet's HDF5 layout: ply_data_{train,test}0.h5 and shape_names.txt."""
    import h5py

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    (root / "shape_names.txt").write_text("airplane\nbathtub\nbed\n")
    for split, count in (("train", 12), ("test", 6)):
        data = points if points is not None else rng.normal(size=(count, 96, 3))
        with h5py.File(root / f"ply_data_{split}0.h5", "w") as f:
            f["data"] = np.asarray(data, dtype=np.float32)
            f["label"] = (np.arange(len(data)) % 3 if labels is None else
                          np.full(len(data), labels))[:, None]
    return root


def test_modelnet_hdf5_files_are_read_with_their_class_names(tmp_path):
    splits = read_modelnet(write_hdf5(tmp_path / "h5"), 64, tmp_path / "cache")
    assert splits.classes == ["airplane", "bathtub", "bed"]
    assert splits.points["train"].shape == (12, 96, 3) and list(splits.labels["val"]) == \
        [0, 1, 2, 0, 1, 2]
    assert np.linalg.norm(splits.points["train"], axis=-1).max() == pytest.approx(1)
    assert not (tmp_path / "cache").exists()  # nothing to sample


@pytest.mark.parametrize("layout", ["off", "hdf5"])
def test_a_modelnet_folder_trains(tmp_path, run_cli, layout):
    root = write_off_folders(tmp_path / "mn") if layout == "off" else write_hdf5(tmp_path / "mn")
    code, out, err = run_cli("run", "pointnet", "data.dataset=modelnet", f"data.path={root}",
                             f"data.points.cache_dir={tmp_path / 'cache'}", *POINT_RUN,
                             "train.max_steps=3", f"output_dir={tmp_path}", "run_name=mn")
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "mn" / "summary.json").read_text())
    assert summary["task"] == "point_cloud_classification" and summary["steps"] == 3
    assert summary["samples_per_second"] > 0 and summary["images_per_second"] is None
    assert "tokens_per_second" not in summary and "clouds/s" in out + err


# ---- bad input: exit 2, the culprit named ----------------------------------------------------

@pytest.mark.parametrize("text, why", [
    ("PLY\n", "must begin with 'OFF'"),
    ("OFF\n4 2 0\n0 0 0\n1 0 0\n", "malformed"),
    ("OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 7\n", "name vertices the file does not have"),
    ("OFF\n3 1 0\n0 0 0\nnan 0 0\n0 1 0\n3 0 1 2\n", "not finite"),
])
def test_a_damaged_mesh_is_named(tmp_path, run_cli, text, why):
    root = write_off_folders(tmp_path / "mn")
    bad = root / "pyramid" / "train" / "pyramid_0002.off"
    bad.write_text(text)
    code, _, err = run_cli("run", "pointnet", "data.dataset=modelnet", f"data.path={root}",
                           f"data.points.cache_dir={tmp_path / 'cache'}", *POINT_RUN,
                           f"output_dir={tmp_path}")
    assert code == 2 and str(bad) in err and why in err, err[-2000:]
    assert "Traceback" not in err
    assert not any((tmp_path / "cache").glob("modelnet-*/complete.json"))


@pytest.mark.parametrize("points, labels, why", [
    (np.zeros((6, 96, 2)), None, "must have the shape (clouds, points, 3), got (6, 96, 2)"),
    (np.where(np.arange(6 * 96 * 3).reshape(6, 96, 3) == 400, np.inf, 1.0), None,
     "1 cloud(s) hold coordinates that are not finite (NaN or inf), the first at index 1"),
    (np.ones((6, 32, 3)), None, "clouds of 32 points, fewer than data.points.num_points=64"),
    (None, 7, "label 7 is outside the 3 classes"),
])
def test_a_damaged_hdf5_file_is_named(tmp_path, run_cli, points, labels, why):
    root = write_hdf5(tmp_path / "h5", points, labels)
    code, _, err = run_cli("run", "pointnet", "data.dataset=modelnet", f"data.path={root}",
                           *POINT_RUN, f"output_dir={tmp_path}")
    assert code == 2 and "ply_data_train0.h5" in err and why in err, err[-2000:]


def test_a_folder_that_is_not_modelnet_says_what_it_expects(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("run", "pointnet", "data.dataset=modelnet",
                           f"data.path={tmp_path / 'empty'}", *POINT_RUN,
                           f"output_dir={tmp_path}")
    assert code == 2 and "holds neither ModelNet's mesh folders" in err


# ---- training on shapes3d, and every verb ----------------------------------------------------


def point_weights(checkpoint: Path) -> dict:
    state = {"model": pointnet_small(num_classes=10, width=0.125).state_dict()}
    dcp.load(state, checkpoint_id=checkpoint)
    return state["model"]


def test_a_point_cloud_run_resumes_bitwise(tmp_path, run_cli, points_cache):
    common = [*points_cache, *POINT_RUN, f"output_dir={tmp_path}", "train.max_steps=10",
              "checkpoint.every_steps=5"]
    code, _, err = run_cli("run", "pointnet", *common, "run_name=straight")
    assert code == 0, err[-2000:]
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    code, _, err = run_cli("run", "pointnet", *common, "run_name=resumed",
                           f"resume={tmp_path / 'resumed' / 'checkpoints' / 'step_00000005'}")
    assert code == 0, err[-2000:]
    losses = [[json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl")
               .read_text().splitlines() if json.loads(line)["kind"] == "train"]
              for name in ("straight", "resumed")]
    assert losses[0][5:] == losses[1][-5:]
    a = point_weights(tmp_path / "straight" / "checkpoints" / "step_00000010")
    b = point_weights(tmp_path / "resumed" / "checkpoints" / "step_00000010")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_memory_predicts_the_pointnet_step_the_cpu_measures(run_cli, points_cache):
    code, out, err = run_cli("memory", "pointnet", *points_cache, "device=cpu", "--gpu-memory",
                             "8GiB", "train.batch_size=16", "--measure", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["estimate"]["input_shape"] == [256, 3]
    measured = report["measured"]
    assert abs(measured["relative_error"]) <= 0.1 and abs(measured["peak_relative_error"]) <= 0.1


def test_profile_and_bench_data_take_a_point_cloud_recipe(tmp_path, run_cli, points_cache):
    code, out, err = run_cli("profile", "pointnet", *points_cache, *POINT_RUN,
                             f"output_dir={tmp_path}", "--steps", "3", "--json")
    assert code == 0, err
    assert json.loads(out)["verdict"]["bound"] == "compute-bound"
    code, out, err = run_cli("bench", "data", "pointnet", *points_cache, *POINT_RUN,
                             "--workers", "1", "--prefetch", "2", "--seconds", "0.5", "--model",
                             "--model-steps", "4", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["unit"] == "cloud" and report["decode_one_core"] is None
    assert report["best"]["samples_per_second"] > 0 and report["model_samples_per_second"] > 0


@pytest.mark.slow
def test_the_pointnet_recipe_tells_the_shapes_apart(pointnet_recipe_run):
    """The README's promise: `hpctrain run pointnet` classifies at least 90 % of held-out
    clouds right, with nothing downloaded (under a minute on two CPU cores; the session trains
    it beside the other recipes, tests/shipped_recipes.py)."""
    _, summary = pointnet_recipe_run
    assert summary["final_val_accuracy"] >= 0.9, summary
