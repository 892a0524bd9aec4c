"""Real steps on this machine, beside the prediction.

On a GPU: torch.cuda.max_memory_allocated over the steps, against the predicted peak. On the
CPU: what the step holds when the forward pass ends (parameters, optimiser states, the
tensors autograd keeps for backward) and its peak, counted by the same storage tracker, against
a prediction made for the CPU's autocast rules (a GPU target's rules differ, so that prediction
is made again for the comparison).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hpctrain.memory.estimate import Estimate, output_width, step_spec
from hpctrain.memory.simulate import measure_cpu, run_steps, simulate

HELD = ("parameters", "gradients", "optimizer states", "weight copies", "activations",
        "inputs")


def held(split: dict[str, int]) -> int:
    """Bytes alive when the forward pass ends."""
    return sum(split.get(k, 0) for k in HELD)


def _error(measured: int, predicted: int) -> float:
    return (predicted - measured) / measured if measured else 0.0


def measure(est: Estimate, config, steps: int = 3) -> dict:
    spec = step_spec(config, est.target, output_width(config)[0])
    if est.target.device == "cuda" and torch.cuda.is_available():
        device = torch.device("cuda")
        torch.cuda.empty_cache()
        model = spec.build_model().to(device)
        optimizer = spec.build_optimizer(model)
        torch.cuda.reset_peak_memory_stats(device)
        run_steps(spec, model, optimizer, est.batch_size, device, steps=steps,
                  on_step=lambda step: step == 0 and torch.cuda.reset_peak_memory_stats())
        peak = torch.cuda.max_memory_allocated(device)
        predicted = est.footprint.peak
        return {"what": f"torch.cuda.max_memory_allocated on {torch.cuda.get_device_name()}",
                "measured_bytes": peak, "predicted_bytes": predicted,
                "relative_error": _error(peak, predicted)}
    cpu_spec = replace(spec, target="cpu", precision="fp32" if est.target.precision in (
        "fp32", "tf32") else est.target.precision)
    real = measure_cpu(cpu_spec, est.batch_size, steps=steps)
    fake = simulate(cpu_spec, est.batch_size)
    return {"what": "bytes held after forward on the CPU: parameters, optimiser states and "
                    "autograd's saved tensors",
            "measured_bytes": held(real.end_of_forward),
            "predicted_bytes": held(fake.end_of_forward),
            "relative_error": _error(held(real.end_of_forward), held(fake.end_of_forward)),
            "measured_peak_bytes": real.peak, "predicted_peak_bytes": fake.peak,
            "peak_relative_error": _error(real.peak, fake.peak)}
