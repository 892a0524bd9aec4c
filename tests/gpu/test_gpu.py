"""GPU paths: need CUDA, so they are skipped elsewhere; run them on the lent GPU machine."""

import json
import time

import pytest
import torch

from hpctrain.train import loop
from hpctrain.train.bookkeeping import Clock, RunningMetrics
from hpctrain.train.build import build_parts
from hpctrain.train.loop import Progress, _run_steps
from hpctrain.train.preemption import Stopper
from hpctrain.train.telemetry import Telemetry

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_auto_picks_bf16_channels_last_compile_and_pinned_memory(tiny_config):
    parts = build_parts(tiny_config("data.num_workers=1"))
    assert parts.plan.device.startswith("cuda") and parts.plan.precision == "bf16"
    assert parts.plan.channels_last and parts.plan.cudnn_benchmark
    assert parts.data.train_loader.pin_memory


@pytest.mark.parametrize("precision", ["bf16", "fp16", "tf32"])
def test_a_gpu_run_completes(tmp_path, run_cli, tiny, precision):
    code, _, err = run_cli("run", "default", *tiny(f"precision={precision}", "compile=false"))
    assert code == 0, err
    summary = json.loads(next((tmp_path / "runs").glob("*/summary.json")).read_text())
    assert summary["precision"] == precision and summary["peak_memory_kind"] == "cuda_allocated"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_no_host_device_synchronisation_inside_the_step(tiny_config, monkeypatch, precision):
    """Synchronising anywhere but the logging read-back raises."""
    parts = build_parts(tiny_config(f"precision={precision}", "compile=false",
                                    "optim.ema.enabled=true", "train.max_steps=6",
                                    "train.log_every=3", "optim.grad_clip_norm=1.0"))
    monkeypatch.setattr(loop, "evaluate_and_record", lambda *a: None)
    monkeypatch.setattr(loop.run_record, "save_checkpoint", lambda *a: None)
    read = RunningMetrics.read

    def read_allowing_sync(self, *args):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return read(self, *args)
        finally:
            torch.cuda.set_sync_debug_mode("error")
    monkeypatch.setattr(RunningMetrics, "read", read_allowing_sync)
    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed))
    finally:
        torch.cuda.set_sync_debug_mode(0)
        telemetry.close()


def test_compiled_run(tmp_path, run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny("compile=true"))
    assert code == 0, err


def test_a_run_decodes_jpegs_on_the_gpu(tmp_path, run_cli, tiny, image_folder):
    from hpctrain.data.images.image_packing import PackOptions, pack

    pack(image_folder, tmp_path / "p", PackOptions(), workers=1, log=lambda *_: None)
    code, _, err = run_cli("run", "default", *tiny(
        "data.dataset=shards", f"data.path={tmp_path / 'p'}", "data.images.decode=gpu",
        "data.num_workers=1", "compile=false", "run_name=nvjpeg"))
    assert code == 0, err
    summary = json.loads((tmp_path / "runs" / "nvjpeg" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_val_accuracy"] is not None


def test_a_gpu_profile_sees_kernels_and_gives_a_gpu_verdict(run_cli, tiny):
    """The CUDA side of hpctrain profile: kernels linked to their launches, GPU evidence."""
    code, out, err = run_cli("profile", "default", *tiny("compile=false"), "--steps", "3",
                             "--json")
    assert code == 0, err
    report = json.loads(out)
    rank = report["ranks"][0]
    assert rank["gpu"] and rank["launch"]["kernels_per_step"] > 10
    assert 0 < rank["temporal"]["compute"] <= 1
    assert sum(rank["idle"][k] for k in ("host_wait", "kernel_wait", "other")) \
        == pytest.approx(1.0, abs=0.01) or rank["idle"]["ms"] == 0
    assert rank["tensor_cores"]["precision"]  # bf16 matrix kernels were recognised
    # a tiny net at batch 16 does far less work than it launches
    assert report["verdict"]["bound"] == "launch-bound"


def test_the_memory_prediction_is_within_10_percent_of_the_gpu_peak(run_cli, tiny, tmp_path):
    """hpctrain memory --measure on the GPU: torch.cuda.max_memory_allocated against the
    prediction made on fake tensors."""
    code, out, err = run_cli("memory", "default", *tiny("train.batch_size=256",
                                                        "data.images.image_size=64"),
                             "--measure", "--out", str(tmp_path), "--json")
    assert code == 0, err
    measured = json.loads(out)["measured"]
    assert "max_memory_allocated" in measured["what"]
    assert abs(measured["relative_error"]) < 0.10


def test_the_batch_search_meets_real_out_of_memory_errors_on_a_capped_gpu(run_cli, tiny,
                                                                          tmp_path):
    """--gpu-memory below the card caps the process: the search meets CUDA's own
    out-of-memory error, recovers, and the largest batch it keeps ran within the cap."""
    code, out, err = run_cli("memory", "default", *tiny("model.name=resnet_small",
                                                        "data.images.image_size=64"),
                             "--gpu-memory", "2GiB", "--find-batch-size", "--out",
                             str(tmp_path), "--json")
    assert code == 0, err
    search = json.loads(out)["search"]
    assert search["device"].startswith("cuda")
    assert any(not t["fits"] for t in search["trials"])
    best = next(t for t in search["trials"] if t["batch_size"] == search["largest"])
    assert best["peak_bytes"] <= 2 * 2**30 and search["recommended"] % 8 == 0
    # the cap ends with the search: this process (the tests' own) has the whole card again
    assert torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda").numel() == 3 * 2**30


def test_nvml_energy_over_30_seconds_matches_mean_power_times_time():
    """The board's energy counter against the power NVML reports, sampled 10 times a second
    for 30 s while the GPU multiplies matrices: within 5 %."""
    from hpctrain.monitor.meter import ROW
    from hpctrain.monitor.start import make_meter

    sampler = make_meter(torch.device("cuda", 0), "here", True, 0.1)
    assert sampler.energy_source == "nvml-counter", sampler.why_not
    a = torch.randn(4096, 4096, device="cuda")
    sampler.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for _ in range(20):
            a = (a @ a).tanh_()
        torch.cuda.synchronize()
    sampler.stop()
    row = dict(zip(ROW, sampler.take()))
    seconds = sampler.last_sample - sampler.first_sample  # the span the counter saw
    mean_power = row["job_power_watts"]
    assert row["job_utilization"] > 0.5 and mean_power > 50
    assert row["job_energy_joules"] == pytest.approx(mean_power * seconds, rel=0.05)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_refinement_from_low_precision_factors_on_the_gpu_reaches_fp64(precision):
    """hpctrain.bench.linalg.solve on CUDA: the trailing updates run on the GPU (Tensor Cores for
    tf32), refined to fp64 backward error as on the CPU."""
    from hpctrain.bench.linalg import FP64_EPS, conditioned_matrix, solve

    A = conditioned_matrix(2048, 10.0, device="cuda")
    b = torch.randn(2048, dtype=torch.float64, device="cuda")
    solution = solve(A, b, precision)
    assert solution.x.device.type == "cuda"
    assert solution.backward_error <= 2048 * FP64_EPS


def test_fp8_trains_a_transformer_whose_layers_gain_and_the_profile_sees_fp8(tmp_path,
                                                                              run_cli):
    """Needs FP8 Tensor Cores (H100/H200) and torchao (carry its wheel to the device)."""
    if torch.cuda.get_device_capability() < (8, 9):
        code, _, err = run_cli("run", "tiny-lm", f"output_dir={tmp_path}", "precision=fp8")
        assert code == 2 and "need 8.9 or newer" in err
        return
    width = ["model.kwargs.width=2048", "model.kwargs.heads=16", "model.kwargs.context=256",
             "data.tokens.seq_len=256",
             "train.batch_size=16", "compile=false", "report=false", "tensorboard=false",
             f"output_dir={tmp_path}"]
    code, out, err = run_cli("run", "tiny-lm", *width, "precision=fp8", "train.max_steps=40",
                             "train.log_every=10")
    assert code == 0, err
    assert "fp8: 12 of 13 Linear layers in float8 (" in out and "warning" not in out
    (run,) = tmp_path.glob("tiny-lm-*")
    rows = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    losses = [r["loss"] for r in rows if r.get("kind") == "train"]
    assert losses[-1] < losses[0] - 1.0
    code, out, err = run_cli("profile", "tiny-lm", *width, "precision=fp8", "--steps", "3",
                             "--json")
    assert code == 0, err
    shares = json.loads(out)["ranks"][0]["tensor_cores"]["precision"]
    assert shares.get("fp8", 0) > 0.5, shares


def test_batch_buffers_are_page_locked_and_copied_asynchronously_intact(image_folder,
                                                                        tmp_path):
    """data.loader=auto on a GPU run: the shared buffers are registered with CUDA once, the
    copies from them are asynchronous, and what arrives is torch's DataLoader's batches."""
    from torch.utils.data import DataLoader

    from hpctrain.config import AugmentConfig
    from hpctrain.data.batch_buffers import BufferedLoader
    from hpctrain.data.images.image_pack import Pack
    from hpctrain.data.images.image_pack_dataset import ShardDataset
    from hpctrain.data.images.image_packing import PackOptions, pack
    from hpctrain.data.sampling import EpochSampler

    pack(image_folder, tmp_path / "p", PackOptions(), workers=1, log=lambda *_: None)
    dataset = ShardDataset(Pack(tmp_path / "p").split("train"), None, True, AugmentConfig(), 0)
    sampler = EpochSampler(len(dataset), 16, shuffle=True)
    loader = BufferedLoader(dataset, sampler, 4, True, 2, max_size=16, pin=True)
    on_device = []
    for images, labels in loader:
        assert images.is_pinned()
        on_device.append(images.to("cuda", non_blocking=True))  # the buffer is reused later
    expected = [images for images, _ in DataLoader(dataset, batch_size=4, sampler=sampler,
                                                   drop_last=True)]
    assert len(on_device) == len(expected) == 6
    assert all(a.cpu().equal(b) for a, b in zip(on_device, expected))
    loader.close()


@pytest.mark.parametrize("dtype, head, masked", [
    (torch.bfloat16, 128, False), (torch.float16, 64, False), (torch.bfloat16, 256, False),
    (torch.float32, 64, False), (torch.float16, 64, True), (torch.bfloat16, 80, False)])
def test_the_predicted_attention_kernel_is_the_one_torch_picks_here(dtype, head, masked):
    """memory/attention.py's choice, made without a GPU, against torch's own on this one
    (torch._fused_sdp_choice: the index of torch.nn.attention.SDPBackend); cuDNN attention
    counts as flash, whose memory it keeps, or with a mask as the efficient kernel, which
    keeps the same bias."""
    from torch.nn.attention import SDPBackend

    from hpctrain.memory.attention import choose

    q = torch.randn(2, 4, 256, head, device="cuda", dtype=dtype, requires_grad=True)
    mask = torch.ones(256, 256, device="cuda", dtype=torch.bool).tril() if masked else None
    picked = SDPBackend(torch._fused_sdp_choice(q, q, q, mask, 0.0, not masked))
    names = {SDPBackend.CUDNN_ATTENTION: "efficient" if masked else "flash",
             SDPBackend.FLASH_ATTENTION: "flash",
             SDPBackend.EFFICIENT_ATTENTION: "efficient", SDPBackend.MATH: "math"}
    predicted = choose(torch.cuda.get_device_capability(), dtype, head, head, masked, True,
                       0.0, True)
    assert predicted == names[picked]


def test_a_lightning_module_trains_in_bf16_with_only_its_forward_compiled(tmp_path):
    """On a GPU `auto` picks bf16 and compile for a LightningModule too: its own forward is
    compiled (its steps and their self.log stay Python), and it learns as on the CPU, its
    per-batch hook logging the gradients' norm each step and over the epoch (issue 54), an
    EarlyStopping called at each epoch's end."""
    import sys
    from pathlib import Path

    from lightning.pytorch.callbacks import EarlyStopping

    import hpctrain

    sys.path.insert(0, str(Path(__file__).parent.parent / "fixtures"))
    from lit_classifier import LitClassifier, blobs

    class Hooked(LitClassifier):
        def on_before_optimizer_step(self, optimizer):
            norms = torch.stack([p.grad.norm() for p in self.parameters()])
            self.log("grad_norm", norms.norm(), on_step=True, on_epoch=True)

    module, stopper = Hooked(), EarlyStopping(monitor="val_loss", patience=5)
    summary = hpctrain.fit(module, *blobs(), output_dir=str(tmp_path), tensorboard=False,
                           report=False, train={"epochs": 3, "batch_size": 32},
                           data={"num_workers": 0}, callbacks=[stopper])
    assert summary["precision"] == "bf16" and summary["final_val_acc"] > 0.9
    assert hasattr(module.forward, "_torchdynamo_orig_callable")  # compiled in place
    assert module.device.type == "cuda"
    records = [json.loads(line) for line in
               (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    epochs = [r["grad_norm_epoch"] for r in records if r["kind"] == "epoch"]
    assert len(epochs) == 3 and all(0 < norm < 1e3 for norm in epochs)
    evaluations = [r["val_loss"] for r in records if r["kind"] == "eval"]
    assert float(stopper.best_score) == pytest.approx(min(evaluations), rel=1e-5)
