"""hpctrain profile: real CPU profiles of real runs, hand-built GPU traces for what a CPU cannot
record (tests/fixtures/gpu_traces/README.md), and the HTA definitions on traces small enough
to work out by hand.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_profile.py, tests/cluster/test_profile.py."""

import contextlib
import gzip
import io
import json
from pathlib import Path

import pytest

from hpctrain.profiling.analysis import analyse
from hpctrain.profiling.collect import collect
from kineto_synth import SCENARIOS, build_fixtures

FIXTURES = Path(__file__).parent.parent / "fixtures" / "gpu_traces"


# ---- hand-built GPU traces -------------------------------------------------------------------

def test_the_fixtures_are_what_the_generator_writes(tmp_path):
    for path in build_fixtures(tmp_path):
        committed = FIXTURES / path.relative_to(tmp_path)
        assert committed.read_bytes() == path.read_bytes(), f"rebuild {committed}"
    assert {p.name for p in FIXTURES.iterdir() if p.is_dir()} == set(SCENARIOS)


EXPECTED = {"launch_bound": "launch-bound", "sync_bound": "sync-bound",
            "compute_bound_tensor_cores": "compute-bound",
            "compute_bound_no_tensor_cores": "compute-bound",
            "memory_bound": "memory-bound", "exposed_communication": "communication-bound"}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict:
    from hpctrain import cli

    out = tmp_path_factory.mktemp("gpu-verdicts")
    reports = {}
    for name in EXPECTED:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert cli.main(["profile", "--trace", str(FIXTURES / name), "--out",
                             str(out / name), "--json"]) == 0
        reports[name] = json.loads(buffer.getvalue())
    return reports


@pytest.mark.parametrize("scenario", EXPECTED)
def test_each_gpu_pattern_gets_its_verdict(verdicts, scenario):
    assert verdicts[scenario]["verdict"]["bound"] == EXPECTED[scenario]


def test_launch_bound_evidence_and_advice(verdicts):
    report = verdicts["launch_bound"]
    launch = report["ranks"][0]["launch"]
    assert launch["kernels_per_step"] == 600
    assert launch["short_kernel_share"] == 1.0  # 3 us kernels, 5 us launches
    assert launch["cpu_launch_ms_per_step"] > launch["gpu_busy_ms_per_step"]
    assert report["ranks"][0]["idle"]["host_wait"] > 0.95
    assert report["verdict"]["recommendations"][0]["setting"] == "compile=true"


def test_sync_bound_names_the_python_line(verdicts):
    report = verdicts["sync_bound"]
    sync = report["ranks"][0]["sync"]
    assert [s["call_site"] for s in sync["sites"]] == ["train.py(63): training_step",
                                                       "train.py(57): training_step"]
    assert all(s["op"] == "aten::_local_scalar_dense" and s["calls"] == 4
               for s in sync["sites"])
    first = report["verdict"]["recommendations"][0]
    assert first["setting"] == "remove the host read at train.py(63): training_step"


def test_tensor_cores_busy_means_nothing_to_recommend(verdicts):
    report = verdicts["compute_bound_tensor_cores"]
    assert report["ranks"][0]["tensor_cores"]["share_of_matrix_time"] == 1.0
    assert report["ranks"][0]["tensor_cores"]["precision"] == {"bf16": 1.0}
    assert report["verdict"]["recommendations"] == []


def test_fp32_without_tensor_cores_is_told_to_use_bf16_and_pad(verdicts):
    report = verdicts["compute_bound_no_tensor_cores"]
    rank = report["ranks"][0]
    assert rank["tensor_cores"]["share_of_matrix_time"] == 0.0
    assert rank["tensor_cores"]["precision"] == {"fp32": 1.0}
    assert rank["matrix_dims"]["offenders"][0]["dims_not_multiple_of_8"] == {"N": 50257}
    settings = [r["setting"] for r in report["verdict"]["recommendations"]]
    assert settings[0] == "precision=bf16"
    assert any("multiples of 8" in s for s in settings)


def test_memory_bound_is_told_to_fuse(verdicts):
    report = verdicts["memory_bound"]
    assert report["ranks"][0]["kernel_mix"]["other_share"] > 0.8
    assert report["verdict"]["recommendations"][0]["setting"] == "compile=true"


def test_two_rank_communication(verdicts):
    report = verdicts["exposed_communication"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        comm = rank["communication"]
        assert 0.1 < comm["overlap"] < 0.2  # 900 us of a 7 ms all-reduce overlap the backward
        assert comm["exposed_share"] > 0.35
    assert report["ranks"][1]["step_ms"]["mean"] > report["ranks"][0]["step_ms"]["mean"]
    assert "train.grad_accum_steps=2" in [r["setting"]
                                          for r in report["verdict"]["recommendations"]]


# ---- the definitions, on traces worked out by hand -------------------------------------------

def _trace(path: Path, kernels: list, runtime: list, header: dict | None = None) -> Path:
    """A trace with one profiler step [0, 1000] us, kernels (name, start, end, correlation,
    stream) and runtime calls (name, start, end, correlation)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
               "tid": 1, "ts": 0, "dur": 1000}]
    events += [{"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": s,
                "dur": e - s, "args": {"correlation": c}} for name, s, e, c in runtime]
    events += [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": s,
                "dur": e - s, "args": {"correlation": c, "stream": stream, "device": 0}}
               for name, s, e, c, stream in kernels]
    path.write_text(json.dumps({**(header or {}), "traceEvents": events}))
    return path


def test_idle_time_is_split_as_hta_defines_it(tmp_path):
    path = _trace(tmp_path / "t.json", kernels=[
        ("gemm_a", 20, 100, 1, 7),
        ("gemm_b", 110, 200, 2, 7),   # launched at 50, long before the gap: kernel-wait (10 us)
        ("gemm_c", 310, 400, 3, 7),   # launched at 300, after the gap began: host-wait (110 us)
        ("gemm_d", 500, 600, 4, 7),   # launched at 150, gap of 100 us: other
    ], runtime=[("cudaLaunchKernel", 10, 15, 1), ("cudaLaunchKernel", 50, 55, 2),
                ("cudaLaunchKernel", 300, 305, 3), ("cudaLaunchKernel", 150, 155, 4),
                ("cudaStreamSynchronize", 205, 290, 5)])
    e = analyse(collect(path))
    assert e.temporal["span_ms"] == pytest.approx(0.580)
    assert e.temporal["idle"] == pytest.approx(220 / 580)
    assert e.temporal["compute"] == pytest.approx(360 / 580)
    assert e.idle["host_wait"] == pytest.approx(110 / 220)
    assert e.idle["kernel_wait"] == pytest.approx(10 / 220)
    assert e.idle["other"] == pytest.approx(100 / 220)
    assert e.losses["sync"] == pytest.approx(110 / 580)  # the sync ended inside that gap
    assert e.losses["launch"] == pytest.approx(0.0)
    assert e.sync["calls_per_step"] == 1 and e.sync["ms_per_step"] == pytest.approx(0.085)
    assert e.launch["short_kernel_share"] == 0.0


def test_communication_overlap_is_the_share_of_nccl_time_under_compute(tmp_path):
    path = _trace(tmp_path / "rank3.json", kernels=[
        ("gemm_a", 100, 200, 1, 7), ("gemm_b", 300, 400, 2, 7),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 150, 350, 3, 20),
    ], runtime=[("cudaLaunchKernel", 10, 15, 1), ("cudaLaunchKernel", 20, 25, 2),
                ("cudaLaunchKernel", 30, 35, 3)])
    e = analyse(collect(path))
    assert e.rank == 3  # from the file name when the trace has no distributedInfo
    assert e.communication["overlap"] == pytest.approx(100 / 200)
    assert e.communication["exposed_share"] == pytest.approx(100 / 300)
    assert e.losses["communication"] == pytest.approx(100 / 300)


@pytest.mark.parametrize("name, matrix, tensor_cores, precision", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", True, True, "bf16"),
    ("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_bf16_TNT", True, True, "bf16"),
    ("volta_h884gemm_128x128_ldg8_nn", True, True, "fp16"),
    ("sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1", True,
     True, "fp8"),
    ("void cutlass::device_kernel<at::cuda::detail::f8f8bf16_rowwise_kernel<true>>", True,
     True, "fp8"),
    ("ampere_sgemm_128x64_nn", True, False, "fp32"),
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc", True, True, "tf32"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>", False, False,
     None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor>", False,
     False, None),
])
def test_kernel_names_tell_matrix_work_tensor_cores_and_precision(name, matrix, tensor_cores,
                                                                   precision):
    from hpctrain.profiling import kernels
    assert kernels.is_matrix(name) == matrix
    if matrix:
        assert kernels.uses_tensor_cores(name) == tensor_cores
        assert kernels.precision(name) == precision


# ---- bad input -------------------------------------------------------------------------------

def test_bad_traces_are_named_with_exit_code_2(run_cli, tmp_path):
    code, _, err = run_cli("profile", "--trace", str(tmp_path / "missing"))
    assert code == 2 and "no such file or folder" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("profile", "--trace", str(tmp_path / "empty"))
    assert code == 2 and "no trace files" in err
    (tmp_path / "nosteps.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5, "tid": 1}]}))
    code, _, err = run_cli("profile", "--trace", str(tmp_path / "nosteps.json"))
    assert code == 2 and "no ProfilerStep#N" in err and "nosteps.json" in err
    twice = tmp_path / "twice"
    twice.mkdir()
    for name in ("a.json", "b.json"):
        _trace(twice / name, [], [], header={"distributedInfo": {"rank": 0, "world_size": 2}})
    code, _, err = run_cli("profile", "--trace", str(twice))
    assert code == 2 and "are both rank 0" in err
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": 1, "dur"'))
    code, _, err = run_cli("profile", "--trace", str(cut))
    assert code == 2 and "truncated" in err
    code, _, err = run_cli("profile", "default", "--trace", str(cut))
    assert code == 2 and "without a recipe" in err
    code, _, err = run_cli("profile", "default", "--steps", "0")
    assert code == 2 and "--steps 0" in err


def test_a_span_narrower_than_a_pixel_draws_where_floats_round_down():
    from PIL import Image, ImageDraw

    from hpctrain.profiling.picture import Shape, pixel_box

    x = 255.70981190280204  # x + 1 - 1 < x in floating point
    box = pixel_box(Shape(x, 10, 0.5, 16))
    assert box[2] >= box[0] and box[3] >= box[1]
    ImageDraw.Draw(Image.new("RGB", (400, 40))).rectangle(box, fill="#000000")


@pytest.mark.parametrize("note, advised", [("", False), ("channels_last off: FSDP shards only "
                                                         "contiguous parameters", None)])
def test_a_switch_the_plan_turned_off_for_a_reason_is_not_advice(tmp_path, note, advised):
    """The profile advises channels_last=true where the run could have had it, not where
    the plan turned it off because FSDP cannot take it."""
    from hpctrain.profiling.profile_report import settings_from_run

    (tmp_path / "config.yaml").write_text("name: default\n")
    (tmp_path / "summary.json").write_text(json.dumps(
        {"system": {"channels_last": False, "note": note}, "strategy": "fsdp"}))
    assert settings_from_run(tmp_path).channels_last is advised


def test_a_host_read_in_hpctrains_own_code_is_no_advice_to_the_user():
    """Advice points at your code, or at hpctrain's setting for its own metric read-back;
    another read in hpctrain's own code (its tasks, its data) is listed as evidence but is
    not told to you as a line to remove (issue 53)."""
    from types import SimpleNamespace

    from hpctrain.profiling.verdict import Settings, _sync_advice

    sites = [{"call_site": call_site, "op": "aten::_local_scalar_dense", "calls": 4,
              "ms": 2.0, "call": "cudaStreamSynchronize"}
             for call_site in ("hpctrain/tasks/lightning_step.py(140): values",
                               "model.py(12): forward",
                               "hpctrain/train/interval_figures.py(50): report_interval")]
    advice = _sync_advice(SimpleNamespace(sync={"sites": sites}), 0.3, Settings(log_every=20))
    assert [a.setting for a in advice] == ["remove the host read at model.py(12): forward",
                                           "train.log_every=50"]


def test_a_host_read_inside_a_library_names_the_library_s_frame_and_its_caller():
    """Issue 67: a read inside torch's AdamW was laid at hpctrain's precision.py, and its
    advice was hpctrain's metric read-back; now the frame that reads is named, with the line
    that called the library, and only a call from your code is advice."""
    from types import SimpleNamespace

    from hpctrain.profiling.analysis import is_library_frame
    from hpctrain.profiling.verdict import Settings, _sync_advice

    assert is_library_frame("torch/optim/optimizer.py(97): _get_value")
    assert is_library_frame("transformers/masking_utils.py(332): _ignore_mask")
    assert not is_library_frame("hpctrain/train/hardware/precision.py(40): step")
    assert not is_library_frame("train.py(63): training_step")
    sites = [{"call_site": "torch/optim/optimizer.py(97): _get_value", "op": "aten::item",
              "called_from": called_from, "calls": 4, "ms": 2.0, "call": "cudaMemcpy"}
             for called_from in ("hpctrain/train/hardware/precision.py(40): step",
                                 "nn.Module: BertModel_0", "train.py(20): main")]
    advice = _sync_advice(SimpleNamespace(sync={"sites": sites}), 0.3, Settings(log_every=20))
    assert [a.setting for a in advice] == ["remove the host read at train.py(20): main"]
    assert "(in torch/optim/optimizer.py(97): _get_value)" in advice[0].why
