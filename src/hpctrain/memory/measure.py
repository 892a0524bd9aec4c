"""Real steps on this machine, beside the prediction, each measured by the allocator itself.

On a GPU: torch.cuda.max_memory_allocated over the steps, against the predicted peak. On the
CPU: what the step holds when the forward pass ends (parameters, optimiser states, the
tensors autograd keeps for backward) and its peak, against a prediction made for the CPU's
autocast rules (a GPU target's rules differ, so that prediction is made again for the
comparison). The CPU's figures come from the CPU allocator's own account of every allocation
and free, as torch.profiler records it (profile_memory), over the last step, plus the bytes
of the parameters, buffers and optimiser states counted from the tensors: nothing of the
storage tracker that makes the prediction (tracker.py), which measured itself before (an
error of 0.0 % by construction). What the tracker misses (an operator's workspace, a buffer
of autograd's engine) now shows as error.
"""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from hpctrain.memory.estimate import Estimate, output_width, step_spec
from hpctrain.memory.simulate import StepSpec, run_steps, simulate
from hpctrain.profiling.names import PREFIX
from hpctrain.readers import parse_json, read_capped

FORWARD = PREFIX + "forward"  # the step's forward region in the profiler's trace (step.py)
TRACE_CAP = 4 << 30  # the profiler's trace of one step: tens of MB for a large model
HELD = ("parameters", "gradients", "optimizer states", "weight copies", "activations",
        "inputs")


def held(split: dict[str, int]) -> int:
    """Bytes alive when the forward pass ends."""
    return sum(split.get(k, 0) for k in HELD)


NOTED = 0.10  # a peak under-predicted by more than this names the operator it came in


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
    after_forward, peak, peak_operator = allocator_step(cpu_spec, est.batch_size, steps)
    fake = simulate(cpu_spec, est.batch_size)
    peak_error = _error(peak, fake.peak)
    return {"what": "bytes held after forward on the CPU (parameters, optimiser states and "
                    "autograd's saved tensors), by the CPU allocator's own account",
            "measured_bytes": after_forward,
            "predicted_bytes": held(fake.end_of_forward),
            "relative_error": _error(after_forward, held(fake.end_of_forward)),
            "measured_peak_bytes": peak, "predicted_peak_bytes": fake.peak,
            "peak_relative_error": peak_error,
            "why": f"the measured peak comes inside {peak_operator}, whose kernel allocates "
                   "memory for itself (a workspace) that the prediction does not see"
                   if peak_error < -NOTED and peak_operator else None}


def allocator_step(spec: StepSpec, batch_size: int, steps: int) -> tuple[int, int, str | None]:
    """(bytes held when the last step's forward pass ends, the step's peak, the operator the
    peak came in) on real CPU tensors: the tensors that live across steps counted from
    themselves, and what the step allocates on top from the CPU allocator's records
    (torch.profiler, profile_memory)."""
    cpu = torch.device("cpu")
    model = spec.build_model()
    optimizer = spec.build_optimizer(model)
    run_steps(spec, model, optimizer, batch_size, cpu, steps=max(1, steps - 1))
    lasting = _storage_bytes([*model.parameters(), *model.buffers(),
                              *(value for state in optimizer.state.values()
                                for value in state.values() if isinstance(value, torch.Tensor))])
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        run_steps(spec, model, optimizer, batch_size, cpu, steps=1)
    with tempfile.TemporaryDirectory() as folder:  # the trace: the profiler's public record
        trace = Path(folder) / "trace.json"
        recorded.export_chrome_trace(str(trace))
        events = parse_json(read_capped(trace, TRACE_CAP))["traceEvents"]
    forward, = [e for e in events if e.get("name") == FORWARD and e.get("ph") == "X"]
    # this thread's allocations and frees, summed: the allocator's own total counts every
    # thread of the process (a test suite's leftover loader threads, say)
    changes = sorted((e["ts"], e["args"]["Bytes"]) for e in events
                     if e.get("name") == "[memory]" and e.get("tid") == forward.get("tid")
                     and e.get("args", {}).get("Device Type") == 0)
    levels = list(zip([time for time, _ in changes],
                      itertools.accumulate(change for _, change in changes)))
    ended = forward["ts"] + forward["dur"]
    at_end = next((level for time, level in reversed(levels) if time <= ended), 0)
    top_time, top = max(levels, key=lambda pair: pair[1], default=(None, 0))
    return lasting + at_end, lasting + top, _innermost_operator(events, top_time)


def _innermost_operator(events: list[dict], time: float | None) -> str | None:
    """The shortest aten operator running at `time` that is more than an allocation."""
    running = [e for e in events if e.get("ph") == "X" and time is not None
               and e["ts"] <= time <= e["ts"] + e["dur"] and e["name"].startswith("aten::")
               and e["name"] not in ("aten::empty", "aten::empty_strided")]
    return min(running, key=lambda e: e["dur"])["name"] if running else None


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    """The bytes of the storages behind `tensors`, each once (tied weights, views)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())
