"""Pipeline parallelism's bubble, measured against (p - 1) / (m + p - 1), and tensor
parallelism's communication per step.

Bubble: for m micro-batches, one process trains the whole GPT on the same m micro-batches one
after the other (gradient accumulation): that is the work, and p stages could at best do it in
1/p of the time. The p-process pipeline's step (hpctrain's real loop, GPipe, 1F1B, or a
looped schedule with v = 2 stages per rank, where the formula's m becomes v x m) is timed
against that ideal; the idle share, 1 - ideal / measured, includes the sends between stages.

Tensor parallelism: the all-reduces of a TP step counted and timed in a profiler trace (rank
0), against the plan's count: per block two forward (the attention's and the MLP's row-wise
outputs) and four backward (the input gradients of q, k, v and the MLP's up projection), and
the vocabulary-parallel embedding's forward and the output layer's backward.

Each configuration is one torchrun launch: a second process group in the same workers would
meet the agent's store holding the first one's keys.

    python benchmarks/pipeline_bubble.py               # CPU, gloo, 2 stages, m = 1, 2, 4, 8
    python benchmarks/pipeline_bubble.py --schedule interleaved-1f1b   # 4 stages on 2 ranks
    python benchmarks/pipeline_bubble.py --stages 4 --microbatches 4,8,16 --width 1024 \\
        --layers 8 --precision bf16                    # one GPU node (NCCL)
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

from harness import median_ms, recipe_parts, time_hpctrain, with_batches


def token_batches(count: int, batch: int, seq_len: int, vocab: int = 256) -> list:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (batch, seq_len + 1), generator=generator)
            for _ in range(count)]


def model_overrides(args) -> list[str]:
    return [f"model.kwargs.width={args.width}", f"model.kwargs.layers={args.layers}",
            f"data.tokens.seq_len={args.seq_len}", f"precision={args.precision}",
            "compile=false", "train.log_every=1000", "data.arithmetic.num_train=2000",
            "data.arithmetic.num_val=10"]


def timed(args, overrides: list[str], tmp: str) -> tuple[float, object]:
    """Median seconds per step of the tiny-lm recipe with `overrides`; and its parts."""
    torch.manual_seed(0)
    parts = recipe_parts("tiny-lm", [*model_overrides(args), *overrides,
                                     f"data.arithmetic.cache_dir={tmp}/cache"], tmp)
    accumulation = parts.config.train.grad_accum_steps
    parts = with_batches(parts, token_batches(4 * accumulation, parts.batch_size,
                                              args.seq_len))
    parts.steps_per_epoch = 4  # each step takes `accumulation` of the batches
    time_hpctrain(parts, 2)  # warm-up
    return median_ms([time_hpctrain(parts, args.steps) for _ in range(args.rounds)]), parts


def worker(args) -> None:
    """Under torchrun: one pipeline step's time (`--case M`, micro-batches) or tensor
    parallelism's all-reduces (`--case tensor`)."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.case != "tensor":
            m = int(args.case)
            schedule = "gpipe" if m < args.stages and args.schedule == "1f1b" else \
                args.schedule
            ms, parts = timed(args, [f"parallel.pipeline={args.stages}",
                                     f"parallel.microbatches={m}",
                                     f"parallel.schedule={schedule}",
                                     f"train.batch_size={args.batch_size}"], tmp)
            row = {"ms": ms, "schedule": schedule}
        else:
            step_ms, parts = timed(args, [f"parallel.tensor={args.stages}",
                                          f"train.batch_size={args.batch_size}"], tmp)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                                   if parts.device.type == "cuda" else [])
            with profile(activities=activities, record_shapes=True) as prof:
                with record_function("profiled_steps"):
                    time_hpctrain(parts, args.steps)
            reduces = [e for e in prof.events()
                       if e.name in ("gloo:all_reduce", "nccl:all_reduce")]
            # the plan's carry activations (batch, tokens, width); the loop's own are scalars
            # and metric sums
            split = [e for e in reduces if len(e.input_shapes[0]) == 3]
            row = {"all_reduces": len(split) / args.steps, "step_ms": step_ms,
                   "others": (len(reduces) - len(split)) / args.steps,
                   "ms": sum(e.cpu_time_total for e in split) / 1e3 / args.steps}
        if parts.distributed.is_main:
            Path(args.out).write_text(json.dumps(row))
        dist.destroy_process_group()


def launched(args, case: str, tmp: str) -> dict:
    """The row of one configuration, from its own torchrun launch."""
    out = Path(tmp) / f"{case}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.stages}", __file__, "--worker", "--case", case,
               "--out", str(out), *sys.argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        sys.exit(f"{args.stages}-process run ({case}) failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def one_process(args) -> dict:
    """The same micro-batches one after the other in one process: the work to divide."""
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.m:
            rows[m], _ = timed(args, [f"train.batch_size={args.batch_size // m}",
                                      f"train.grad_accum_steps={m}"], tmp)
        rows["whole"], _ = timed(args, [f"train.batch_size={args.batch_size}"], tmp)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=2, help="processes (pipeline stages; "
                        "also the tensor-parallel size)")
    parser.add_argument("--microbatches", default="1,2,4,8")
    parser.add_argument("--schedule", default="1f1b",
                        choices=["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"],
                        help="for m >= stages (GPipe below)")
    parser.add_argument("--batch-size", type=int, default=16, help="per pipeline")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--steps", type=int, default=4, help="steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.m = [int(m) for m in args.microbatches.split(",")]
    if args.worker:
        worker(args)
        return
    torch.set_num_threads(1)  # one core per stage; the one process gets one core too
    with tempfile.TemporaryDirectory() as tmp:
        many = {"pipeline": {m: launched(args, str(m), tmp) for m in args.m},
                "tensor": launched(args, "tensor", tmp)}
    one = one_process(args)
    p = args.stages
    print(f"pipeline_bubble: GPT width {args.width}, {args.layers} layers, {args.seq_len} "
          f"tokens, batch {args.batch_size}, {args.precision}, {p} stages, one thread per "
          f"process, {args.rounds} rounds x {args.steps} steps (median)")
    v = 2 if args.schedule in ("interleaved-1f1b", "zero-bubble") else 1  # stages per rank
    print(f"{'micro-batches':<15}{'schedule':<18}{'1 process ms':>14}{'pipeline ms':>13}"
          f"{'idle measured':>15}{'(p-1)/(vm+p-1)':>16}{'ratio':>8}")
    for m in args.m:
        row = many["pipeline"][m]
        idle = 1 - one[m] / p / row["ms"]
        predicted = (p - 1) / (v * m + p - 1)  # Megatron-LM: interleaving divides it by v
        print(f"{m:<15}{row['schedule']:<18}{one[m]:>14.1f}{row['ms']:>13.1f}{idle:>15.2f}"
              f"{predicted:>16.2f}{idle / predicted:>8.2f}")
    tensor = many["tensor"]
    # forward: each block's two row-wise outputs and the embedding's; backward: the input
    # gradients of each block's four column-wise projections (q, k, v, MLP up) and the output
    # layer's
    expected = 6 * args.layers + 2
    print(f"\ntensor parallelism over {p}: {tensor['step_ms']:.1f} ms/step against "
          f"{one['whole']:.1f} ms on one process ({one['whole'] / tensor['step_ms']:.2f}x); "
          f"{tensor['all_reduces']:.0f} all-reduces of activations per step (the plan: "
          f"{expected}), {tensor['ms']:.1f} ms of them; {tensor['others']:.0f} of the loop's "
          "own (stop flag, figures)")


if __name__ == "__main__":
    main()
