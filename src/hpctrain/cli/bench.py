"""The `hpctrain bench` verbs: `bench data` (how fast the input pipeline runs), and the
node's limits, `bench node` and `bench solve`. Parsing and printing only; the measurements
are in bench/."""

from __future__ import annotations

import json
import re

from hpctrain.cli.arguments import (JSON_HELP, add_recipe, count, counts, make_verb,
                                    seconds)
from hpctrain.errors import ConfigError

SOLVE_EXAMPLE = """examples:
  hpctrain bench solve                               # n = 1024 on the CPU, fp32 and bf16 factors
  hpctrain bench solve --size 8192 --device cuda --precisions fp16,bf16,tf32,fp32
  hpctrain bench solve --conditions 1e2,1e8 --json

Each factor precision's LU is refined to fp64 backward error (plain refinement, GMRES-IR where
that stalls), or refused when the system is beyond that precision; the baseline is
torch.linalg.solve in fp64. In Python: hpctrain.bench.linalg.solve(A, b, factor_precision='bf16').
"""


NODE_EXAMPLE = """examples:
  hpctrain bench node                                   # this machine: GPU, or CPU
  hpctrain bench node --data /scratch/imagenet-packed   # and the read bandwidth of a path
  torchrun --nproc-per-node 8 -m hpctrain bench node    # and the all-reduce between the GPUs

The matrix multiplies are TFLOP/s and a share of the spec sheet where the device is known;
bandwidths in GB/s (10^9 bytes); the all-reduce as nccl-tests' bus bandwidth. The results are
kept in ~/.local/state/hpctrain/node/HOST.json.
"""


def add_verbs(verbs) -> None:
    _add_bench(verbs)


BENCH_DATA_EXAMPLE = """examples:
  hpctrain bench data imagenet-resnet50 data.path=/scratch/imagenet-packed
  hpctrain bench data imagenet-resnet50 data.path=/scratch/imagenet-packed --model \\
      --processes-per-node 8             # per GPU of an 8-GPU node: its share of the cores
  hpctrain bench data default --workers 1,2 --prefetch 2 --seconds 3 --json
  hpctrain bench data imagenet-resnet50 data.path=/scratch/imagenet-packed --python
"""


def _add_bench(verbs) -> None:
    """`hpctrain bench` and its parts' arguments."""
    bench = verbs.add_parser("bench", help="measure one part of the training pipeline")
    bench_verbs = bench.add_subparsers(dest="bench_verb", metavar="PART")
    bench_verbs.required = True
    bench_data = make_verb(bench_verbs, "data", "how fast the input pipeline runs, and whether "
                           "it keeps the model fed", BENCH_DATA_EXAMPLE, cmd_bench_data)
    add_recipe(bench_data)
    bench_data.add_argument("--workers", help="DataLoader worker counts to try, e.g. 2,4,8 "
                            "(default: 1, 2, 4, ... up to the cores)")
    bench_data.add_argument("--prefetch", default="2,4", help="prefetch depths to try")
    bench_data.add_argument("--seconds", type=seconds, default=5.0,
                            help="timing per setting (default 5)")
    bench_data.add_argument("--model", action="store_true",
                            help="also time the recipe's training step on synthetic data")
    bench_data.add_argument("--model-steps", type=count(1), default=30, help="--model: the "
                            "training steps timed")
    bench_data.add_argument("--processes-per-node", type=count(1), default=1,
                            help="training processes (GPUs) sharing this node's cores")
    bench_data.add_argument("--python", action="store_true",
                            help="then sample the training process and its workers at the "
                            "recommended setting (py-spy, else cProfile): the hottest Python "
                            "functions and the shares of reading, decoding, augmentation, "
                            "transport and the rest")
    bench_data.add_argument("--json", action="store_true", help=JSON_HELP)
    _add_node_and_solve(bench_verbs)


def cmd_bench_data(args) -> int:
    from hpctrain.bench.data_path import bench_data

    report = bench_data(args.recipe, args.overrides, counts(args.workers, "--workers"),
                        counts(args.prefetch, "--prefetch"), args.seconds, args.model,
                        args.model_steps, args.processes_per_node, args.python)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    what = f"{report.image_size} px" if report.unit == "image" else f"{report.unit}s"
    print(f"input pipeline of {report.recipe}: {report.dataset}, batch {report.batch_size}, "
          f"{what}, {report.cores} cores for this process")
    if report.decode_one_core is not None:
        print(f"decode only, one core ({report.decoder or 'PIL'}): "
              f"{report.decode_one_core:,.0f} img/s")
    rate = "img/s" if report.unit == "image" else f"{report.unit}s/s"
    print(f"{'workers':>8}{'prefetch':>10}{rate:>12}")
    for s in report.settings:
        mark = "  <- best" if s is report.best else ""
        print(f"{s.num_workers:>8}{s.prefetch_factor:>10}{s.samples_per_second:>12,.0f}{mark}")
    if report.ratio is not None:
        print(f"best: {report.ratio:.0%} of the decode limit ({report.ceiling:,.0f} img/s = "
              f"one core x {min(report.best.num_workers, report.cores)})")
    if report.model_samples_per_second is not None:
        print(f"model training step alone: {report.model_samples_per_second:,.0f} {rate}")
    if report.python is not None:
        print("\n".join(report.python.lines()))
    for line in report.advice:
        print(f"- {line}")
    return 0


def _add_node_and_solve(bench_verbs) -> None:
    node = make_verb(bench_verbs, "node", "this node's limits: matrix multiplies per dtype, "
                     "memory and transfer bandwidth, all-reduce, JPEG decoding, reading",
                     NODE_EXAMPLE, cmd_bench_node)
    node.add_argument("--size", type=count(64), help="the largest matrix side (default: 8192 "
                      "on a GPU, 2048 on a CPU); each dtype's side doubles from 128 while a "
                      "multiply takes under a sixteenth of --seconds")
    node.add_argument("--megabytes", type=count(1), default=256,
                      help="size of the copies and the all-reduce (default 256)")
    node.add_argument("--seconds", type=seconds, default=0.5, help="timing per row")
    node.add_argument("--data", metavar="PATH", help="also read this file or folder")
    node.add_argument("--json", action="store_true", help=JSON_HELP)
    solve = make_verb(bench_verbs, "solve", "Ax = b to fp64 accuracy from low-precision LU "
                      "factors (Tensor Cores for HPC), against an fp64 solve", SOLVE_EXAMPLE,
                      cmd_bench_solve)
    solve.add_argument("--size", type=count(2), default=1024, help="n (default 1024)")
    solve.add_argument("--precisions", default="fp32,bf16",
                       help="factor precisions: fp16, bf16, tf32, fp32 (default fp32,bf16)")
    solve.add_argument("--conditions", default="1e1,1e3,1e6,1e9,1e12",
                       help="condition numbers of the test matrices")
    solve.add_argument("--repeats", type=count(1), default=3, help="the best time of these")
    solve.add_argument("--device", default="cpu", help="cpu or cuda")
    solve.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_bench_solve(args) -> int:
    import torch

    from hpctrain.bench.solve import bench_solve, text
    from hpctrain.bench.linalg import FACTOR_PRECISIONS

    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    unknown = [p for p in precisions if p not in FACTOR_PRECISIONS]
    if unknown or not precisions:
        raise ConfigError(f"--precisions {args.precisions}: use {', '.join(FACTOR_PRECISIONS)}")
    try:
        conditions = [float(c) for c in args.conditions.split(",")]
    except ValueError:
        conditions = []
    if not conditions or min(conditions) < 1:
        raise ConfigError(f"--conditions {args.conditions}: numbers of at least 1, e.g. "
                          "1e2,1e8")
    if args.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", args.device):
        raise ConfigError(f"--device {args.device}: use cpu, cuda or cuda:N")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {args.device}: no CUDA device here; use --device cpu")
    rows = bench_solve(args.size, precisions, conditions, args.repeats, args.device)
    if args.json:
        print(json.dumps([row.to_json() for row in rows], indent=1))
    else:
        print(text(rows, args.size, args.device))
    return 0


def cmd_bench_node(args) -> int:
    import os
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from hpctrain.bench.node import bench_node, keep

    if args.data and not Path(args.data).exists():
        raise ConfigError(f"--data {args.data}: no such file or folder")
    local = int(os.environ.get("LOCAL_RANK", 0))
    gpu = torch.cuda.is_available()
    device = torch.device(f"cuda:{local}") if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:  # under torchrun: the all-reduce too
        dist.init_process_group("nccl" if gpu else "gloo")
    try:
        rows = bench_node(device, args.size or (8192 if gpu else 2048), args.megabytes,
                          args.seconds, Path(args.data) if args.data else None)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", 0)) != 0:  # rank 0 reports for the node
        return 0
    name = torch.cuda.get_device_name(device) if gpu else "cpu"  # as a run's plan names it
    kept = keep(rows, name)
    if args.json:
        print(json.dumps({"device": name, "kept": str(kept),
                          "rows": [row.to_json() for row in rows]}, indent=1))
        return 0
    print(f"limits of this node: {name}" if gpu else
          f"limits of this node: no GPU, the CPU measured ({len(os.sched_getaffinity(0))} "
          "cores for this process)")
    for row in rows:
        share = f"{row.share:>6.0%} of spec" if row.share is not None else ""
        print(f"  {row.group:<11}{row.name:<30}{_figure(row.value):>12} {row.unit:<9}"
              f"{share:<15}{row.note}")
    print(f"kept in {kept}")
    return 0


def _figure(value: float) -> str:
    """Three significant digits at least: a slow dtype's 0.0042 TFLOP/s is not 0.00."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}" if value >= 1 else f"{value:.3g}"
