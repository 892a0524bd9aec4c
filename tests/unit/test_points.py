"""Point clouds: sampling on meshes, shapes3d, PointNet, the device augmentation, ModelNet's two
layouts and their damaged files, and training runs (bitwise resume, every verb).

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_points.py."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from hpctrain.data.points.settings import PointsConfig
from hpctrain.data.points import shapes3d
from hpctrain.data.points.modelnet import read_modelnet, read_off
from hpctrain.data.points.clouds import sample_on_faces
from hpctrain.tasks.point_cloud_classification import perturb
from hpctrain.data.points.pointnet import orthogonality, pointnet, pointnet_small
from point_files import CUBE_OFF, POINT_RUN, points_cache, write_off_folders


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

    import hpctrain.data.points.pointnet as module

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
    # rounding: of sums over 4,096 points, so to the gradients' scale (an element of 5.6e-4,
    # where they reach 2.0, differed by 1.7e-6 on a Xeon with AMX; a norm's bias, whose
    # gradient is rounding alone, by 1e-8); a gradient backed into the wrong points differs by
    # the scale itself
    scale = max(grad.abs().max().item() for grad in shared.values())
    for name, grad in shared.items():
        assert torch.allclose(ours[name], grad, rtol=1e-3, atol=1e-5 * scale), name
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

