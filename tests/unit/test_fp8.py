"""precision=fp8: refused clearly where there is no FP8 hardware; the layer plan by hand; the
real torchao float8 layers trained on the CPU (torch._scaled_mm runs there, slowly), alone and
under FSDP2 with float8 all-gather between two gloo processes; the profile's FP8 advice.

Only the hardware check is replaced here (this machine has no CUDA); every layer, cast and
all-gather below is torchao's and torch's own. The GPU runs are in test_gpu.py.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_fp8.py, tests/cluster/test_fp8.py."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hpctrain.errors import ConfigError, DeviceError
from hpctrain.train.hardware import fp8

FIXTURES = Path(__file__).parent.parent / "fixtures"


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
