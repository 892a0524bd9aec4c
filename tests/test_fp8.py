"""precision=fp8: refused clearly where there is no FP8 hardware; the layer plan by hand; the
real torchao float8 layers trained on the CPU (torch._scaled_mm runs there, slowly), alone and
under FSDP2 with float8 all-gather between two gloo processes; the profile's FP8 advice.

Only the hardware check is replaced here (this machine has no CUDA); every layer, cast and
all-gather below is torchao's and torch's own. The GPU runs are in test_gpu.py."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hpctrain.errors import ConfigError, DeviceError
from hpctrain.train.hardware import fp8

FIXTURES = Path(__file__).parent / "fixtures"
TINY_LM = ["model.kwargs.width=64", "train.max_steps=24", "train.log_every=8",
           "tensorboard=false", "report=false", "data.num_workers=0"]


def settings(**overrides):
    return SimpleNamespace(**{"scaling": "tensorwise", "layers": "auto", "skip": [],
                              "output_layer": False, **overrides})


def test_fp8_on_the_cpu_is_exit_2_naming_the_capability_needed(run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny("precision=fp8"))
    assert code == 2 and "Traceback" not in err
    assert "compute capability 8.9 or newer" in err and "precision=bf16" in err


def test_a_gpu_older_than_ada_is_refused_and_a_missing_torchao_named(monkeypatch):
    """CUDA cannot run here: the device's answers are stood in for."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(DeviceError, match="A100 has compute capability 8.0; FP8 Tensor Cores "
                       "need 8.9 or newer"):
        fp8.check_available(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    fp8.check_available(torch.device("cuda"))  # an H100 with torchao: nothing to say
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ConfigError, match=r"pip install 'hpctrain\[fp8\]'"):
        fp8.check_available(torch.device("cuda"))


def _transformer_like() -> nn.Module:
    """Shapes only (on the meta device): an MLP pair, an odd layer and a large output."""
    with torch.device("meta"):
        return nn.ModuleDict({"attention": nn.Linear(2048, 2048),  # K 2048, N 2048
                              "up": nn.Linear(1024, 4096),  # N 4096 > 1024: gains
                              "down": nn.Linear(4096, 1024),  # K 4096, N 1024: too small
                              "odd": nn.Linear(1000, 2048),  # 1000 is no multiple of 16
                              "head": nn.Linear(2048, 8192)})  # the output layer


def test_the_layer_plan_by_hand():
    model = _transformer_like()
    plan = fp8.plan_layers(model, settings(), fsdp=False)
    assert plan.converted == ["attention", "up"]
    assert plan.kept == {"down": "too small to gain; fp8.layers=all converts it",
                         "odd": "dimensions not multiples of 16",
                         "head": "the output layer; fp8.output_layer=true converts it"}
    total = 2048 * 2048 + 1024 * 4096 + 4096 * 1024 + 1000 * 2048 + 2048 * 8192
    assert plan.share == pytest.approx((2048 * 2048 + 1024 * 4096) / total)
    assert plan.share < 0.5 and "only 27% of the model's Linear FLOPs" in plan.warning()
    rowwise = fp8.plan_layers(model, settings(scaling="rowwise", output_layer=True,
                                              skip=["attention"]), fsdp=True)
    # rowwise gains only above N 2048, K 1024 and (N 4096 or K 2048): the head alone
    assert rowwise.converted == ["head"] and rowwise.kept["attention"] == "fp8.skip"
    assert not rowwise.float8_all_gather  # FSDP gathers float8 only with tensorwise scales
    everything = fp8.plan_layers(model, settings(layers="all"), fsdp=True)
    assert everything.converted == ["attention", "up", "down"]
    assert everything.float8_all_gather and "down (4096->1024)" in everything.warning()
    assert "3 of 5 Linear layers in float8" in everything.describe()


@pytest.fixture
def fp8_without_the_hardware_check(monkeypatch):
    """The CPU passes as FP8 hardware: the float8 layers then train through the CPU's
    torch._scaled_mm, the code path a GPU takes with faster kernels."""
    monkeypatch.setattr(fp8, "check_available", lambda device: None)


def _train(config):
    from hpctrain.train.bookkeeping import Clock
    from hpctrain.train.build import build_parts
    from hpctrain.train.loop import Progress, _run_steps
    from hpctrain.train.preemption import Stopper
    from hpctrain.train.run_summary import banner
    from hpctrain.train.telemetry import Telemetry

    parts = build_parts(config)
    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed))
    telemetry.close()
    lines = (parts.run_dir / "metrics.jsonl").read_text().splitlines()
    losses = [r["loss"] for r in map(json.loads, lines) if r.get("kind") == "train"]
    return parts, losses, banner(parts, None)


def test_fp8_trains_like_bf16_and_keeps_the_checkpoint_keys(fp8_without_the_hardware_check,
                                                             tmp_path):
    from hpctrain.config import load_config
    from torchao.float8.float8_linear import Float8Linear

    runs = [f"output_dir={tmp_path}"]
    bf16, bf16_losses, _ = _train(load_config("tiny-lm", [*TINY_LM, *runs, "precision=bf16"]))
    parts, losses, banner = _train(load_config("tiny-lm", [*TINY_LM, *runs, "precision=fp8",
                                                           "fp8.layers=all"]))
    converted = [n for n, m in parts.model.named_modules() if isinstance(m, Float8Linear)]
    assert len(converted) == 12 and "head" not in converted  # 2 blocks x (4 + 2), not the head
    assert "fp8: 12 of 13 Linear layers in float8" in banner
    assert "are too small to gain from FP8" in banner  # 64-wide layers, converted on request
    assert losses[-1] < losses[0] - 0.5  # it learns
    assert losses[-1] == pytest.approx(bf16_losses[-1], rel=0.03)
    assert parts.model.state_dict().keys() == bf16.model.state_dict().keys()


@pytest.mark.distributed
def test_fsdp_gathers_float8_weights_and_learns_what_one_process_learns(tmp_path):
    """Two gloo processes shard a model whose Linear layers gather in float8; both see the
    same batches, so the mean gradient is one process's and the weights must end where a
    single unsharded fp8 model's do."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(FIXTURES / "fsdp_fp8.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["gathered_in_float8"] == ["0", "2"]  # the output layer stays bf16
    assert result["moved"] > 1e-2  # the weights did change ...
    # ... and to where one process moves them, within float8 and bf16 rounding (plain FSDP
    # without the float8 all-gather differs as much: 5 %)
    assert result["largest_difference"] < 0.1 * result["moved"]


def test_layouts_fp8_cannot_serve_are_refused():
    from hpctrain.config import load_config
    from hpctrain.parallel.layout import Layout
    from hpctrain.parallel.processes import check_layout

    config = load_config("tiny-lm", ["precision=fp8", "parallel.tensor=2"])
    layout = Layout(data=1, tensor=2, pipeline=1, strategy="ddp")
    with pytest.raises(ConfigError, match="parallel.tensor=2 with precision=fp8 is not "
                       "supported yet"):
        check_layout(config, layout, torch.device("cpu"), "fp8")


def test_the_profile_suggests_fp8_on_hopper_and_bf16_where_fp8_gains_nothing():
    """The busy-Tensor-Core trace (bf16 GEMMs): a bf16 run on an H100 is pointed to FP8; a
    run that asked for fp8 but whose matrix time is all bf16 kernels is told FP8 does not
    pay; on an A100 nothing changes."""
    from hpctrain.profiling.profile_report import analyse_traces, find_traces
    from hpctrain.profiling.verdict import Settings, decide

    ranks = analyse_traces(find_traces(FIXTURES / "gpu_traces" / "compute_bound_tensor_cores"))

    def advice(precision: str, device: str) -> list[str]:
        found = decide(ranks, Settings(precision=precision, device_name=device))
        return [r.setting for r in found.recommendations]

    assert advice("bf16", "NVIDIA H100 80GB HBM3") == ["precision=fp8 (pip install "
                                                       "'hpctrain[fp8]')"]
    assert advice("fp8", "NVIDIA H100 80GB HBM3") == ["precision=bf16"]
    assert advice("bf16", "NVIDIA A100-SXM4-80GB") == []
