"""The `hpctrain bench` verbs of the node's limits (issue 23): `bench solve` so far. Parsing
and printing only; the measurements are in bench/."""

from __future__ import annotations

import json

from hpctrain.arguments import count
from hpctrain.errors import ConfigError

SOLVE_EXAMPLE = """examples:
  hpctrain bench solve                               # n = 1024 on the CPU, fp32 and bf16 factors
  hpctrain bench solve --size 8192 --device cuda --precisions fp16,bf16,tf32,fp32
  hpctrain bench solve --conditions 1e2,1e8 --json

Each factor precision's LU is refined to fp64 backward error (plain refinement, GMRES-IR where
that stalls), or refused when the system is beyond that precision; the baseline is
torch.linalg.solve in fp64. In Python: hpctrain.linalg.solve(A, b, factor_precision='bf16').
"""


def add_verbs(bench_verbs, make_verb) -> None:
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
    solve.add_argument("--json", action="store_true")


def cmd_bench_solve(args) -> int:
    import torch

    from hpctrain.bench.solve import bench_solve, text
    from hpctrain.linalg import FACTOR_PRECISIONS

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
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {args.device}: no CUDA device here; use --device cpu")
    rows = bench_solve(args.size, precisions, conditions, args.repeats, args.device)
    if args.json:
        print(json.dumps([row.to_json() for row in rows], indent=1))
    else:
        print(text(rows, args.size, args.device))
    return 0
