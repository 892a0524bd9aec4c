"""Point clouds: sampling on meshes, shapes3d, PointNet, the device augmentation, ModelNet's two
layouts and their damaged files, and training runs (bitwise resume, every verb)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpctrain.data.points.settings import PointsConfig
from hpctrain.data.points import shapes3d
from hpctrain.data.points.modelnet import read_modelnet, read_off
from hpctrain.data.points.clouds import sample_on_faces
from hpctrain.tasks.point_cloud_classification import perturb
from hpctrain.models.pointnet import orthogonality, pointnet, pointnet_small

CUBE_OFF = "OFF\n8 12 0\n" + "".join(f"{x} {y} {z}\n" for x in (-1, 1) for y in (-1, 1)
                                      for z in (-1, 1)) + "".join(
    f"3 {a} {b} {c}\n" for face in shapes3d.CUBE_FACES
    for a, b, c in ((face[0], face[1], face[2]), (face[0], face[2], face[3])))
PYRAMID_OFF = "OFF5 5 0\n0 0 0\n2 0 0\n2 2 0\n0 2 0\n1 1 3\n" \
              "4 0 1 2 3\n3 0 1 4\n3 1 2 4\n3 2 3 4\n3 3 0 4\n"  # ModelNet's fused header


# ---- sampling and the built-in dataset -------------------------------------------------------

def test_points_fall_on_the_faces_in_proportion_to_their_area(tmp_path):
    # two triangles in the z=0 plane, of areas 0.5 and 4.5 (a share of 10 % and 90 %)
    vertices = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [2, 0, 0], [5, 0, 0], [2, 3, 0.0]])
    points = sample_on_faces(vertices, np.array([[0, 1, 2], [3, 4, 5]]), 20000,
                             np.random.default_rng(0))
    assert points.shape == (20000, 3) and np.all(points[:, 2] == 0)
    in_small = (points[:, 0] + points[:, 1] <= 1 + 1e-6) & (points[:, 0] <= 1)
    assert in_small.mean() == pytest.approx(0.1, abs=0.01)
    (tmp_path / "cube.off").write_text(CUBE_OFF)
    cube = sample_on_faces(*read_off(tmp_path / "cube.off"), 5000, np.random.default_rng(1))
    assert np.allclose(np.abs(cube).max(axis=1), 1)  # every point on a face of the cube


def test_shapes3d_clouds_are_reproducible_normalised_and_of_every_kind():
    assert len(shapes3d.CLASSES) >= 8
    clouds = [shapes3d.render(0, "train", i, 512) for i in range(len(shapes3d.CLASSES))]
    assert [label for _, label in clouds] == list(range(len(shapes3d.CLASSES)))
    again, _ = shapes3d.render(0, "train", 3, 512)
    assert np.array_equal(again, clouds[3][0])
    assert not np.array_equal(shapes3d.render(0, "val", 3, 512)[0], again)
    for points, _ in clouds:
        assert points.shape == (512, 3) and points.dtype == np.float32
        radius = np.linalg.norm(points - points.mean(axis=0), axis=1)
        assert radius.max() == pytest.approx(1, abs=1e-5)


def test_shapes3d_is_generated_once(tmp_path):
    first = shapes3d.ensure_shapes3d(tmp_path, 0, 20, 10, 64)
    stamp = (first / "train_points.npy").stat().st_mtime_ns
    assert shapes3d.ensure_shapes3d(tmp_path, 0, 20, 10, 64) == first
    assert (first / "train_points.npy").stat().st_mtime_ns == stamp
    assert np.load(first / "val_points.npy").shape == (10, 64, 3)
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # nothing half-made left


# ---- the model and the augmentation ----------------------------------------------------------

def test_pointnet_ignores_the_order_of_the_points():
    torch.manual_seed(0)
    model = pointnet_small(num_classes=5).eval()
    points = torch.randn(4, 256, 3)
    shuffled = points[:, torch.randperm(256)]
    with torch.no_grad():
        assert torch.allclose(model(points), model(shuffled), atol=1e-5)


def test_pointnet_returns_its_regulariser_while_training():
    model = pointnet(num_classes=40).train()
    assert 3.4e6 < sum(p.numel() for p in model.parameters()) < 3.6e6  # the paper's 3.5 M
    logits, regulariser = model(torch.randn(2, 64, 3))
    assert logits.shape == (2, 40)
    assert regulariser.item() == 0  # the T-Nets start as the identity
    rotation = torch.linalg.qr(torch.randn(3, 64, 64))[0]
    assert orthogonality(rotation).item() == pytest.approx(0, abs=1e-4)
    assert orthogonality(2 * torch.eye(64)[None]).item() == pytest.approx(64 * 9)


@pytest.mark.parametrize("copies", [False, True])
def test_pointnet_s_pooling_gives_the_gradients_amax_gives(monkeypatch, copies):
    """max_pool backs its gradient into one point, amax shares it among every point at the
    maximum: the same weights' gradients, bitwise without ties, to rounding where point
    dropout copied one point over half the cloud (the copies tie)."""
    import copy

    import hpctrain.models.pointnet as module

    torch.manual_seed(0)
    model = pointnet_small(num_classes=10)
    points, labels = torch.randn(8, 512, 3), torch.randint(0, 10, (8,))
    if copies:
        points[:, 256:] = points[:, :1]

    def gradients(net) -> dict:
        torch.manual_seed(1)  # the classifier's dropout
        logits, regulariser = net(points)
        (torch.nn.functional.cross_entropy(logits, labels) + regulariser).backward()
        return {name: p.grad for name, p in net.named_parameters()}

    ours = gradients(copy.deepcopy(model))
    monkeypatch.setattr(module, "max_pool", lambda x: x.amax(dim=1))
    shared = gradients(model)
    bitwise = {name: torch.equal(ours[name], grad) for name, grad in shared.items()}
    if not copies:
        assert all(bitwise.values()), [name for name, same in bitwise.items() if not same]
        return
    for name, grad in shared.items():
        assert torch.allclose(ours[name], grad, rtol=1e-3, atol=1e-6), name
    assert not all(bitwise.values())  # the copies did tie: the two backward passes differ


def test_training_perturbation_turns_about_the_up_axis_and_drops_points():
    points = torch.randn(16, 100, 3)
    turned = perturb(points, PointsConfig(scale=(1, 1), jitter_sigma=0, dropout_max=0), 1)
    assert torch.equal(turned[..., 1], points[..., 1])  # heights kept, y up
    assert torch.allclose(turned.norm(dim=-1), points.norm(dim=-1), atol=1e-5)
    assert not torch.allclose(turned, points)
    scaled = perturb(points, PointsConfig(rotate=False, scale=(2, 2), jitter_sigma=0,
                                          dropout_max=0), 2)
    assert torch.allclose(scaled, 2 * points)
    torch.manual_seed(0)
    dropped = perturb(points, PointsConfig(rotate=False, scale=(1, 1), jitter_sigma=0,
                                           dropout_max=0.8), 2)
    kept = (dropped == points).all(dim=-1)
    assert 0 < (~kept).sum() < points.shape[0] * points.shape[1] * 0.8
    assert torch.equal(dropped[~kept], points[:, :1].expand_as(points)[~kept])
    jittered = perturb(points, PointsConfig(rotate=False, scale=(1, 1), jitter_sigma=1,
                                            jitter_clip=0.05, dropout_max=0), 2)
    assert (jittered - points).abs().max() <= 0.05 + 1e-6


# ---- ModelNet's layouts ----------------------------------------------------------------------

def write_off_folders(root: Path, off: dict[str, str] | None = None) -> Path:
    """ModelNet's mesh layout: <class>/{train,test}/*.off (cubes and pyramids)."""
    off = off or {"cube": CUBE_OFF, "pyramid": PYRAMID_OFF}
    for name, text in off.items():
        for folder, count in (("train", 4), ("test", 2)):
            (root / name / folder).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                (root / name / folder / f"{name}_{i:04d}.off").write_text(text)
    return root


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


def test_modelnet_mesh_folders_are_sampled_once_into_the_cache(tmp_path):
    root = write_off_folders(tmp_path / "ModelNet2")
    splits = read_modelnet(root, 128, tmp_path / "cache")
    assert splits.classes == ["cube", "pyramid"]
    assert splits.points["train"].shape == (8, 128, 3) and splits.points["val"].shape[0] == 4
    assert list(splits.labels["train"]) == [0] * 4 + [1] * 4
    clouds = np.asarray(splits.points["train"])
    assert np.linalg.norm(clouds, axis=-1).max(axis=1) == pytest.approx(1)  # normalised
    assert not np.array_equal(clouds[0], clouds[1])  # each mesh sampled with its own seed
    (cached,) = (tmp_path / "cache").iterdir()
    stamp = (cached / "train_points.npy").stat().st_mtime_ns
    read_modelnet(root, 128, tmp_path / "cache")
    assert (cached / "train_points.npy").stat().st_mtime_ns == stamp


def test_modelnet_hdf5_files_are_read_with_their_class_names(tmp_path):
    splits = read_modelnet(write_hdf5(tmp_path / "h5"), 64, tmp_path / "cache")
    assert splits.classes == ["airplane", "bathtub", "bed"]
    assert splits.points["train"].shape == (12, 96, 3) and list(splits.labels["val"]) == \
        [0, 1, 2, 0, 1, 2]
    assert np.linalg.norm(splits.points["train"], axis=-1).max() == pytest.approx(1)
    assert not (tmp_path / "cache").exists()  # nothing to sample


POINT_RUN = ["data.num_workers=0", "tensorboard=false", "train.batch_size=4",
             "train.log_every=1", "train.eval_every_epochs=100", "data.points.num_points=64",
             "model.kwargs.width=0.125"]


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


@pytest.mark.parametrize("override, why", [
    ("model.name=hpctrain:resnet_small", "does not take point clouds"),
    ("data.dataset=shapes", "is a point-cloud model, but the data is images"),
    ("task=language_modeling", "cannot learn from data.dataset=shapes3d"),
    ("model.name=hf:/some/llama", "is a language model, but the data is point clouds"),
])
def test_a_model_or_task_that_does_not_fit_point_clouds_is_refused(tmp_path, run_cli,
                                                                   points_cache, override, why):
    code, _, err = run_cli("run", "pointnet", *points_cache, *POINT_RUN, override,
                           f"data.shapes.cache_dir={tmp_path}", f"output_dir={tmp_path}")
    assert code == 2 and why in err, err[-2000:]


# ---- training on shapes3d, and every verb ----------------------------------------------------

@pytest.fixture(scope="module")
def points_cache(tmp_path_factory) -> list[str]:
    cache = tmp_path_factory.mktemp("shapes3d-cache")
    return [f"data.shapes3d.cache_dir={cache}", "data.shapes3d.num_train=64",
            "data.shapes3d.num_val=20"]


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
def test_the_pointnet_recipe_tells_the_shapes_apart(tmp_path_factory):
    """The README's promise: `hpctrain run pointnet` classifies at least 90 % of held-out
    clouds right, with nothing downloaded (under a minute on two CPU cores)."""
    from conftest import run_installed

    out = tmp_path_factory.mktemp("pointnet")
    result = run_installed("run", "pointnet", f"output_dir={out}", "run_name=recipe",
                           f"data.shapes3d.cache_dir={out / 'cache'}", timeout=1500)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "recipe" / "summary.json").read_text())
    assert summary["final_val_accuracy"] >= 0.9, summary
