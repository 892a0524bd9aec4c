"""Model FLOPs utilisation of a language model: 6 x parameters x tokens/s (forward and
backward of every weight, attention left out, as in the PaLM paper's appendix B) against the
devices' dense peak for the precision that ran.

The peak is this node's own where `hpctrain bench node` has measured it (the matrix multiply
rate of that dtype on that device, kept per host), else the spec sheet's dense (not sparse)
Tensor Core figure; a device neither measured nor listed gets no MFU rather than a guessed one.
"""

from __future__ import annotations

from hpctrain.readers import json_mapping
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
    kept = json_mapping(node_limits_path())
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


def model_flops_utilisation(parameters: int, tokens_per_second: float | None,
                            world_size: int, plan) -> float | None:
    peak = peak_flops(plan.device_name, plan.precision)
    if peak is None or not tokens_per_second:
        return None
    return 6 * parameters * tokens_per_second / (peak * world_size)
