"""examples/: each runs as its README says, on data the test writes (a few steps each)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_distributed import launch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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
    return [f"data.path={data}", f"output_dir={out}", f"run_name={name}", "data.image_size=16",
            "train.global_batch_size=16", "train.epochs=2", "train.log_every=1",
            "tensorboard=false"]


def train_losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


@pytest.mark.distributed
def test_the_csv_example_trains_and_two_processes_match_one(csv_data, tmp_path):
    recipe = str(EXAMPLES / "csv_images" / "recipe.yaml")
    for nproc, name in ((1, "one"), (2, "two")):
        done = launch(nproc, [*csv_overrides(csv_data, tmp_path, name),
                              "data.num_workers=2" if nproc == 1 else "data.num_workers=1"],
                      recipe=recipe)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["steps"] == 2 * 96 // 16 and summary["final_val_accuracy"] > 0.5
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(two) == 12
    assert one == pytest.approx(two, abs=1e-5)
