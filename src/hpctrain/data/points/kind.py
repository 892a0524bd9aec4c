"""Points: the data kind of point-cloud classification. Its settings (points per cloud,
the perturbations, the built-in shapes3d) and its datasets (data/points/datasets.py) are
asked through `SPEC`."""

from __future__ import annotations

from hpctrain.data.kind import DataKind, moving_batcher, own_check
from hpctrain.data.points.settings import PointsConfig, Shapes3dConfig

ASSUMED_CLASSES = 40  # ModelNet40's: what memory assumes of clouds it cannot read


def _datasets_of(data, seed: int, rank: int, scratch):
    from hpctrain.data.points.datasets import point_datasets

    return point_datasets(data)


def _up_axis(data) -> int:
    from hpctrain.data.points.datasets import up_axis

    return up_axis(data)


def _width(data):
    """The classes, from the class folders or the built-in list (no cloud read)."""
    from hpctrain.data.points.datasets import point_classes
    from hpctrain.errors import UserError

    try:
        return point_classes(data), None
    except UserError as err:
        return ASSUMED_CLASSES, (f"number of classes assumed {ASSUMED_CLASSES} ({err}); set "
                                 "data.num_classes")


def _smaller_sample(data, shape: tuple[int, ...]):
    fewer = data.points.num_points // 2
    if fewer >= 16:
        return "data.points.num_points", fewer, "half the points per cloud"
    return None


SPEC = DataKind(
    name="points", samples_word="point clouds",
    model_hint="a point-cloud model (hpctrain:pointnet or hpctrain:pointnet_small)",
    unit=lambda data: "cloud", batcher=moving_batcher,
    datasets=("shapes3d", "modelnet"), needs_path=("modelnet",),
    settings={"points": PointsConfig, "shapes3d": Shapes3dConfig},
    models={name: f"hpctrain.data.points.pointnet:{name}"
            for name in ("pointnet", "pointnet_small")}, model_word="a point-cloud model",
    only_its_models=True, datasets_of=_datasets_of,
    sample_shape=lambda data: (data.points.num_points, 3), width=_width,
    smaller_sample=_smaller_sample, task_facts={"up_axis": _up_axis},
    own_facts=lambda data: {"num_points": data.points.num_points},
    own_sample_problem=own_check("cloud_sample_problem"),
    own_expected=lambda data: "(points, label): float points of shape (N, 3) and an integer "
                              "label",
    classes_needed=True)
