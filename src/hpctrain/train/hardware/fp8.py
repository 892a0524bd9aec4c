"""FP8 training (precision=fp8): the model's large Linear layers compute their matrix
multiplies in float8 through torchao's float8 training, everything else under bf16 autocast.

FP8 halves the bytes and doubles the Tensor Core rate of bf16 (Hopper: 1979 against 989 dense
TFLOP/s), but each converted layer pays for scaling and casting its inputs, weights and
gradients. Small matrices lose: torchao's H100 tables put the break-even near K x N = 4096 x
1024 for tensorwise scaling and higher for rowwise. So by default (fp8.layers=auto) only the
layers above those sizes are converted, the output layer stays in bf16 (its logits feed the
loss directly), and the run says how much of the Linear work FP8 covers, warning when it is
too little to gain. Under FSDP2 with tensorwise scaling the converted weights are gathered in
float8 (half the all-gather bytes) and their scales computed once per step for all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from hpctrain.errors import ConfigError, DeviceError

FP8_CAPABILITY = (8, 9)  # Ada (L4, L40S) and Hopper (H100, H200) onwards
# Below this share of the Linear FLOPs in float8 the casts cost about what FP8 saves.
WORTHWHILE_SHARE = 0.5


def check_available(device: torch.device) -> None:
    """precision=fp8 needs FP8 Tensor Cores and torchao; say which is missing."""
    if device.type != "cuda":
        raise DeviceError("precision=fp8 needs a GPU with FP8 Tensor Cores (compute capability "
                          "8.9 or newer: L4, L40S, H100, H200, B200); this run is on the CPU. "
                          "Use precision=bf16 here")
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_CAPABILITY:
        raise DeviceError(
            f"precision=fp8: {torch.cuda.get_device_name(device)} has compute capability "
            f"{capability[0]}.{capability[1]}; FP8 Tensor Cores need 8.9 or newer (L4, L40S, "
            "H100, H200, B200). Use precision=bf16 on this GPU")
    try:
        importlib.import_module("torchao.float8")
    except ImportError:
        raise ConfigError("precision=fp8 trains through torchao's float8 layers, which are not "
                          "installed: pip install 'hpctrain[fp8]'") from None


def gains(out_features: int, in_features: int, scaling: str) -> bool:
    """Whether a Linear of this shape runs faster in FP8 than in bf16 on an H100 (torchao's
    published microbenchmarks: N outputs, K inputs, large M)."""
    n, k = out_features, in_features
    if scaling == "tensorwise":
        return k > 4096 or n > 1024
    return n > 2048 and k > 1024 and (n > 4096 or k > 2048)


@dataclass
class Fp8Plan:
    """Which Linear layers compute in float8, and why the others do not."""

    scaling: str
    converted: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # layer name -> why it stays bf16
    converted_flops: int = 0  # multiply-adds per input row, converted layers
    total_flops: int = 0  # the same over every Linear
    small: list[str] = field(default_factory=list)  # converted although too small to gain
    float8_all_gather: bool = False

    @property
    def share(self) -> float:
        return self.converted_flops / self.total_flops if self.total_flops else 0.0

    def describe(self) -> str:
        text = (f"{len(self.converted)} of {len(self.converted) + len(self.kept)} Linear layers "
                f"in float8 ({self.share:.0%} of their FLOPs), {self.scaling} scaling")
        if self.float8_all_gather:
            text += ", FSDP gathers their weights in float8"
        if self.kept:
            reasons: dict[str, list[str]] = {}
            for name, why in self.kept.items():
                reasons.setdefault(why, []).append(name)
            text += "; kept in bf16: " + "; ".join(
                f"{_few(names)} ({why})" for why, names in reasons.items())
        return text

    def warning(self) -> str | None:
        """A run that cannot gain from FP8, said at its start with what to do instead."""
        if self.small:
            return (f"precision=fp8: {_few(self.small)} are too small to gain from FP8 "
                    "(fp8.layers=all converted them); they may run slower than in bf16")
        if self.share < WORTHWHILE_SHARE:
            return (f"precision=fp8: only {self.share:.0%} of the model's Linear FLOPs are in "
                    "layers large enough to gain from FP8 (torchao's H100 break-even: K x N "
                    "about 4096 x 1024); expect no speed-up over precision=bf16. `hpctrain "
                    "profile` shows the FP8 share of the matrix time")
        return None


def _few(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def plan_layers(model: nn.Module, settings, fsdp: bool) -> Fp8Plan:
    """Decide layer by layer from `settings` (config.fp8): divisible by 16 (the FP8 kernels'
    requirement), not named in fp8.skip, not the output layer unless asked, and, under
    fp8.layers=auto, large enough to gain."""
    plan = Fp8Plan(settings.scaling,
                   float8_all_gather=fsdp and settings.scaling == "tensorwise")
    linears = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    output = linears[-1][0] if linears else None
    for name, layer in linears:
        n, k = layer.out_features, layer.in_features
        plan.total_flops += n * k
        if any(part in name for part in settings.skip):
            plan.kept[name] = "fp8.skip"
        elif name == output and not settings.output_layer:
            plan.kept[name] = "the output layer; fp8.output_layer=true converts it"
        elif n % 16 or k % 16:
            plan.kept[name] = "dimensions not multiples of 16"
        elif not gains(n, k, settings.scaling) and settings.layers == "auto":
            plan.kept[name] = "too small to gain; fp8.layers=all converts it"
        else:
            plan.converted.append(name)
            plan.converted_flops += n * k
            if not gains(n, k, settings.scaling):
                plan.small.append(f"{name} ({k}->{n})")
    return plan


def convert(model: nn.Module, settings, fsdp: bool) -> Fp8Plan:
    """Swap the planned Linear layers for torchao's Float8Linear, in place (their state_dict
    keys are unchanged, so checkpoints move between fp8 and bf16 runs)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    plan = plan_layers(model, settings, fsdp)
    if not plan.converted:
        return plan
    chosen = set(plan.converted)
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True) \
        if plan.float8_all_gather else Float8LinearConfig.from_recipe_name(settings.scaling)
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda module, name: name in chosen)
    return plan


def after_step(model: nn.Module, plan: Fp8Plan | None) -> Callable[[], None] | None:
    """Under float8 all-gather: the weights' scales for the next forward, computed for every
    layer in one all-reduce after the optimiser step instead of one per layer."""
    if plan is None or not plan.float8_all_gather or not plan.converted:
        return None
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    return lambda: precompute_float8_dynamic_scale_for_fsdp(model)

