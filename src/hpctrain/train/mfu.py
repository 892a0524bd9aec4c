"""Model FLOPs utilisation of a language model: 6 x parameters x tokens/s (forward and
backward of every weight, attention left out, as in the PaLM paper's appendix B) against the
devices' dense peak for the precision that ran.

The peaks are the spec sheets' dense (not sparse) Tensor Core figures; a device not listed
gets no MFU rather than a guessed one.
"""

from __future__ import annotations

PEAK_TFLOPS = {  # name fragment (lower case) -> {precision: dense TFLOP/s}
    "h200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
    "h100 80gb hbm3": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},  # SXM
    "h100": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},  # PCIe
    "a100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "v100": {"fp16": 125.0, "fp32": 15.7},
    "l40s": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
}


def peak_flops(device_name: str, precision: str) -> float | None:
    """FLOP/s of one device at `precision`, or None for a device not in the table."""
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
