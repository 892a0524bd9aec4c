"""Model FLOPs utilisation of a language model: model FLOPs per token x tokens/s against the
devices' dense peak for the precision that ran.

Model FLOPs per token are the PaLM paper's (Chowdhery et al. 2022, "PaLM: Scaling Language
Modeling with Pathways", appendix B): 6N + 12·L·H·Q·T, where N is the number of parameters,
L the layers, H the heads, Q the head dimension and T the sequence length; 6N is the forward
and backward pass of every weight, 12·L·H·Q·T the attention's own matrix multiplies
(scores and weighted values). N counts every parameter of the whole model once, on every
pipeline stage (a stage holds only its own: counted on the model before it is cut), tied
weights once, and leaves out embedding tables that are only looked up (no multiply). A model
whose attention shape is unknown (your own) counts 6N and says so.

The peak is this node's own where `hpctrain bench node` has measured it (the matrix multiply
rate of that dtype on that device, kept per host), else the spec sheet's dense (not sparse)
Tensor Core figure; a device neither measured nor listed gets no MFU rather than a guessed one.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from hpctrain.readers import MiB, json_mapping
from hpctrain.runs.directory import node_limits_path

PEAK_TFLOPS = {  # name fragment (lower case) -> {precision: dense TFLOP/s}
    "h200": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
    "h100 80gb hbm3": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.0,  # SXM
                       "fp32": 67.0},
    "h100": {"fp8": 1513.0, "bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},  # PCIe
    "a100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "v100": {"fp16": 125.0, "fp32": 15.7},
    "l40s": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
}


def measured_flops(device_name: str, precision: str) -> float | None:
    """FLOP/s of `precision`'s matrix multiplies as `hpctrain bench node` measured them on
    this host's `device_name`, or None."""
    kept = json_mapping(node_limits_path(), MiB)
    if kept is None or kept.get("device") != device_name:
        return None
    for row in kept.get("rows", []):
        if row.get("group") == "matmul" and row.get("name") == precision:
            return row["value"] * 1e12
    return None


def peak_flops(device_name: str, precision: str) -> float | None:
    """FLOP/s of one device at `precision`: measured on this node, else the spec sheet's."""
    return measured_flops(device_name, precision) or spec_flops(device_name, precision)


def peak_source(device_name: str, precision: str) -> str | None:
    """What peak_flops divides by, for the reader: "measured bf16", "spec bf16" or None."""
    if measured_flops(device_name, precision):
        return f"measured {precision}"
    return f"spec {precision}" if spec_flops(device_name, precision) else None


def spec_flops(device_name: str, precision: str) -> float | None:
    """The spec sheet's FLOP/s of one device at `precision`, or None for one not listed."""
    name = device_name.lower()
    for fragment, peaks in PEAK_TFLOPS.items():
        if fragment in name:
            value = peaks.get(precision)
            return value * 1e12 if value else None
    return None


@dataclass(frozen=True)
class ModelFlops:
    """A model's size as its FLOPs per token count it."""

    parameters: int  # every stage's, tied weights once
    multiplied: int  # N: the parameters less the embedding tables only looked up
    attention: tuple[int, int, int] | None  # (L, H, Q) of a transformer; None: unknown

    def per_token(self, seq_len: int) -> float:
        """6N + 12·L·H·Q·T (6N where the attention's shape is unknown)."""
        layers, heads, head_dim = self.attention or (0, 0, 0)
        return 6 * self.multiplied + 12 * layers * heads * head_dim * seq_len

    @property
    def formula(self) -> str:
        return "6N + 12LHQT (PaLM, appendix B)" if self.attention else \
            "6N (PaLM, appendix B; the attention term left out: the model's shape is unknown)"


def model_flops(model: nn.Module) -> ModelFlops:
    """The counts of the whole `model` (before a pipeline cuts it). Its attention shape comes
    from its `attention_shape()` (hpctrain's GPT, transformers' causal LMs) when it has one."""
    unique = {id(p): p for p in model.parameters() if p.requires_grad}
    multiplied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    looked_up = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)
                 and id(m.weight) not in multiplied}
    shape = getattr(model, "attention_shape", None)
    return ModelFlops(sum(p.numel() for p in unique.values()),
                      sum(p.numel() for key, p in unique.items() if key not in looked_up),
                      shape() if callable(shape) else None)


def model_flops_utilisation(flops_per_unit: float, units_per_second: float | None,
                            world_size: int, plan) -> float | None:
    """The share of the devices' peak that the model's FLOPs (per unit of the task's
    throughput: a token for a language model) take at `units_per_second`."""
    peak = peak_flops(plan.device_name, plan.precision)
    if peak is None or not units_per_second:
        return None
    return flops_per_unit * units_per_second / (peak * world_size)
