"""Point clouds as files: OFF meshes of a cube and a pyramid in class folders, the overrides of
a point-cloud run, and the generated shapes3d set shared by a module's tests."""

from pathlib import Path

import pytest

from hpctrain.data.points import shapes3d

CUBE_OFF = "OFF\n8 12 0\n" + "".join(f"{x} {y} {z}\n" for x in (-1, 1) for y in (-1, 1)
                                      for z in (-1, 1)) + "".join(
    f"3 {a} {b} {c}\n" for face in shapes3d.CUBE_FACES
    for a, b, c in ((face[0], face[1], face[2]), (face[0], face[2], face[3])))


PYRAMID_OFF = "OFF5 5 0\n0 0 0\n2 0 0\n2 2 0\n0 2 0\n1 1 3\n" \
              "4 0 1 2 3\n3 0 1 4\n3 1 2 4\n3 2 3 4\n3 3 0 4\n"  # ModelNet's fused header


def write_off_folders(root: Path, off: dict[str, str] | None = None) -> Path:
    """ModelNet's mesh layout: <class>/{train,test}/*.off (cubes and pyramids)."""
    off = off or {"cube": CUBE_OFF, "pyramid": PYRAMID_OFF}
    for name, text in off.items():
        for folder, count in (("train", 4), ("test", 2)):
            (root / name / folder).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                (root / name / folder / f"{name}_{i:04d}.off").write_text(text)
    return root


POINT_RUN = ["data.num_workers=0", "tensorboard=false", "train.batch_size=4",
             "train.log_every=1", "train.eval_every_epochs=100", "data.points.num_points=64",
             "model.kwargs.width=0.125"]


@pytest.fixture(scope="module")
def points_cache(tmp_path_factory) -> list[str]:
    cache = tmp_path_factory.mktemp("shapes3d-cache")
    return [f"data.shapes3d.cache_dir={cache}", "data.shapes3d.num_train=64",
            "data.shapes3d.num_val=20"]
