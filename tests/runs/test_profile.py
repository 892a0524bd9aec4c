"""hpctrain profile: the tests that train, in this process or in an `hpctrain` process of their
own (the others are tests/unit/test_profile.py, tests/cluster/test_profile.py)."""

import gzip
import json
from pathlib import Path

import pytest
from PIL import Image

from conftest import write_image_folder
from hpctrain.profiling.names import REGIONS

FIXTURES = Path(__file__).parent.parent / "fixtures" / "gpu_traces"


# ---- real profiles on the CPU ----------------------------------------------------------------

@pytest.fixture(scope="module")
def slow_images(tmp_path_factory) -> Path:
    """Large noise PNGs: decoding one takes milliseconds, a tiny model's step less."""
    root = tmp_path_factory.mktemp("slow-images")
    write_image_folder(root / "train", per_class=16, size=640, ext="png")
    write_image_folder(root / "val", per_class=2, size=640, ext="png")
    return root


def test_a_run_reading_slow_images_is_input_bound(tiny, run_cli, slow_images, tmp_path):
    code, out, err = run_cli("profile", "default", *tiny(
        "data.dataset=imagefolder", f"data.path={slow_images}"),
        "--steps", "3", "--json")
    assert code == 0, err
    report = json.loads(out)
    verdict = report["verdict"]
    assert verdict["bound"] == "input-bound"
    assert verdict["numbers"]["input_loss"] >= 0.5
    settings = [r["setting"] for r in verdict["recommendations"]]
    assert settings[0].startswith("hpctrain pack")  # an image folder: pack it first
    assert any(s.startswith("hpctrain bench data default") for s in settings)


def test_python_sampling_follows_the_run_and_its_loader_worker(tiny, run_cli, slow_images):
    """profile --python: py-spy samples the training process and its loader workers for the
    whole profiled run, each placed in the input path's stages. The worker decodes large PNGs:
    on tiny in-memory images it is on a CPU for a few milliseconds, too few for py-spy's
    100 Hz to be sure of one sample."""
    code, out, err = run_cli("profile", "default", *tiny(
        "data.num_workers=1", "data.dataset=imagefolder", f"data.path={slow_images}"),
        "--steps", "2", "--python", "--json")
    assert code == 0, err
    python = json.loads(out)["python"]
    assert python["tool"] == "py-spy" and python["seconds"] > 0
    training, *children = python["processes"]
    assert training["role"] == "training process" and training["samples"] > 0
    # the loaders' workers (training, and validation's started for each evaluation); their
    # shares by stage are checked on real photographs in test_bench_data.py. Other children
    # (multiprocessing's resource tracker) are named as such, after the workers.
    roles = [c["role"] for c in children]
    assert "worker" in roles and set(roles) <= {"worker", "other process"}
    assert roles == sorted(roles, key=lambda role: role != "worker")
    assert all(sum(p["stages"].values()) == pytest.approx(1) for p in python["processes"])
    code, _, err = run_cli("profile", "--trace", str(FIXTURES / "launch_bound"), "--python")
    assert code == 2 and "without a recipe, overrides or --python" in err


def test_a_fast_in_memory_run_is_not_input_bound_and_writes_every_output(tiny, run_cli):
    code, out, err = run_cli("profile", "default", *tiny(
        "data.dataset=synthetic", "data.images.image_size=32", "model.name=hpctrain:resnet_small",
        "train.batch_size=32"), "--steps", "3", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["verdict"]["bound"] == "compute-bound"
    assert "CPU-only trace" in report["verdict"]["reason"]
    rank = report["ranks"][0]
    assert rank["steps"] == 3 and not rank["gpu"]
    assert set(REGIONS) <= set(rank["regions"])
    assert sum(r["share"] for r in rank["regions"].values()) == pytest.approx(1.0, abs=0.01)

    trace, = map(Path, report["traces"])
    assert trace.name == "trace.rank0.json.gz" and trace.parent.name == "profile"
    document = json.loads(gzip.decompress(trace.read_bytes()))  # what Perfetto opens
    assert {e["name"] for e in document["traceEvents"]} >= {"ProfilerStep#4", "hpctrain/forward"}
    assert not list(trace.parent.glob(".*partial*"))

    outputs = {name: Path(path) for name, path in report["outputs"].items()}
    assert json.loads(outputs["profile.json"].read_text())["verdict"] == report["verdict"]
    page = outputs["profile.html"].read_text()
    assert "<svg" in page
    for needs_network in ("<script", "src=", "href=", "@import", "url("):
        assert needs_network not in page  # renders offline
    assert "forward" in page and "compute-bound" in page
    with Image.open(outputs["profile.png"]) as picture:
        assert picture.format == "PNG" and picture.width == 1100

    # the same run directory, analysed again without running anything
    code, again, err = run_cli("profile", "--trace", str(trace.parent.parent), "--json")
    assert code == 0, err
    assert json.loads(again)["verdict"]["bound"] == "compute-bound"
    from hpctrain.report.series import read_run

    profiled = read_run(trace.parent.parent)  # what the run's report prints: the verdict whole
    assert profiled.profile == report["verdict"] and not profiled.damage


def test_a_hugging_face_model_s_profile_lays_each_host_read_at_the_frame_that_reads(
        run_cli, tmp_path):
    """Issue 67: torch's AdamW reads its step counts on the host (foreach, on the CPU); the
    profile names torch's frame and the optimiser step of hpctrain's that called it, not
    hpctrain's precision.py as the reader."""
    fixture = FIXTURES.parent / "hf_recipe.py"
    recipe = tmp_path / "text.yaml"
    recipe.write_text(f"name: text\ntask: classification\nmodel: {{name: '{fixture}:classifier'}}"
                      f"\ndata: {{dataset: '{fixture}:reviews', num_workers: 0}}\n"
                      f"optim: {{name: adamw}}\noutput_dir: {tmp_path}\n")
    code, out, err = run_cli("profile", str(recipe), "--steps", "3", "--json")
    assert code == 0, err
    sites = json.loads(out)["ranks"][0]["sync"]["sites"]
    adamw = next(site for site in sites if site["call_site"].startswith("torch/optim/"))
    assert adamw["called_from"].startswith("hpctrain/train/")
    assert not any(site["call_site"].startswith("hpctrain/") and site["called_from"] is None
                   and "precision" in site["call_site"] for site in sites)
