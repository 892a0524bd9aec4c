"""Data-parallel scaling: 1 vs N processes (weak scaling, the same batch per process), and how
much of DDP's gradient all-reduce hides behind the backward pass, read from a profiler trace.

Each side runs under torchrun with hpctrain's real step loop (harness.py) on in-memory
batches, one thread per process. The overlap is measured on rank 0 of the N-process run: the
share of the time gloo spends in all-reduce that falls inside the backward pass (union of the
autograd backward ops' intervals, per profiled step).

    python benchmarks/ddp_overlap.py                      # CPU, gloo, 1 vs 2 processes
    python benchmarks/ddp_overlap.py --nproc 8 --model torchvision:resnet50 --image-size 224 \
        --batch-size 128 --precision bf16                 # one 8-GPU node (NCCL)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from harness import hpctrain_parts, make_batches, median_ms, time_hpctrain, with_batches


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [tuple(x) for x in out]


def covered(intervals, windows) -> float:
    """Total length of `intervals` (merged) that lies inside `windows` (merged)."""
    total = 0.0
    for a0, a1 in merged(intervals):
        for w0, w1 in windows:
            total += max(0.0, min(a1, w1) - max(a0, w0))
    return total


def hidden_fraction(events, steps: list[tuple[float, float]]) -> tuple[float, float]:
    """(fraction of all-reduce time inside backward, all-reduce ms per step)."""
    reduce = [(e.time_range.start, e.time_range.end) for e in events
              if e.name in ("gloo:all_reduce", "nccl:all_reduce")]
    backward = []
    for s0, s1 in steps:  # one window per step: its first to its last backward op
        ops = [(e.time_range.start, e.time_range.end) for e in events
               if e.name.endswith("Backward0") and s0 <= e.time_range.start <= s1]
        if ops:
            backward.append((min(o[0] for o in ops), max(o[1] for o in ops)))
    reduce_total = sum(b - a for a, b in merged(reduce))
    if not reduce_total:
        return 0.0, 0.0
    return covered(reduce, merged(backward)) / reduce_total, reduce_total / 1e3 / len(steps)


def worker(args) -> None:
    overrides = [f"model.name={args.model}", f"data.images.image_size={args.image_size}",
                 f"train.batch_size={args.batch_size}", f"precision={args.precision}",
                 "compile=false", "data.synthetic.num_classes=10", "train.log_every=10"]
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        parts = hpctrain_parts(overrides, tmp)
        parts = with_batches(parts, make_batches(8, parts.batch_size, args.image_size, 10,
                                                 pin=parts.device.type == "cuda"))
        time_hpctrain(parts, 3)  # warm-up
        samples = [time_hpctrain(parts, args.steps) for _ in range(args.rounds)]
        result = {"ms_per_step": median_ms(samples), "world_size": parts.world_size,
                  "global_batch": parts.global_batch_size}
        if parts.world_size > 1:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]
                         if parts.device.type == "cuda" else [ProfilerActivity.CPU]) as prof:
                with record_function("profiled_steps"):
                    time_hpctrain(parts, 4)
            events = prof.events()
            window = [(e.time_range.start, e.time_range.end) for e in events
                      if e.name == "profiled_steps"]
            result["hidden"], result["allreduce_ms"] = hidden_fraction(events, window)
            if parts.distributed.is_main:
                prof.export_chrome_trace(str(Path(args.out).with_suffix(".trace.json")))
    if parts.distributed.is_main:
        Path(args.out).write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()


def launch(args, nproc: int, out: Path) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", __file__, "--worker", "--out", str(out),
               "--model", args.model, "--image-size", str(args.image_size), "--batch-size",
               str(args.batch_size), "--precision", args.precision, "--steps", str(args.steps),
               "--rounds", str(args.rounds)]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        sys.exit(f"{nproc}-process run failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--model", default="hpctrain:resnet_small")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        one = launch(args, 1, Path(tmp) / "one.json")
        many = launch(args, args.nproc, Path(tmp) / "many.json")
    print(f"ddp_overlap: {args.model}, {args.image_size} px, batch {args.batch_size} per "
          f"process, {args.precision}, 1 thread per process, {args.rounds} rounds x "
          f"{args.steps} steps (median)")
    print(f"{'processes':<11}{'ms/step':>9}{'img/s':>9}{'scaling efficiency':>20}"
          f"{'all-reduce ms/step':>20}{'hidden in backward':>20}")
    base = one["global_batch"] / one["ms_per_step"]
    for row in (one, many):
        rate = row["global_batch"] / row["ms_per_step"]
        efficiency = rate / (base * row["world_size"])
        reduce = f"{row['allreduce_ms']:.1f}" if "hidden" in row else "-"
        hidden = f"{row['hidden']:.0%}" if "hidden" in row else "-"
        print(f"{row['world_size']:<11}{row['ms_per_step']:>9.1f}{rate * 1e3:>9.0f}"
              f"{efficiency:>20.2f}{reduce:>20}{hidden:>20}")


if __name__ == "__main__":
    main()
