"""A launch-bound step with and without CUDA graphs: the same recipe run eager, compiled in
torch's default mode, and compiled with CUDA graphs (compile_mode=reduce-overhead), each job a
process of its own, compared by their steady samples/s (summary.json: after the first
interval, which holds the compilation) against the compiled default mode.

What each row ran is read back from its summary, not assumed: the mode the plan resolved (on
a CPU, reduce-overhead runs as default and says so), the graphs compiled and torch's skips of
CUDA graphs with its latest reason. On an H200 the default recipe's step was 181 kernels of a
median 2 us, the GPU idle 95 % of it (docs/benchmarks.md): the row CUDA graphs should move.

    python benchmarks/cuda_graphs.py                       # the default recipe, 200 steps
    python benchmarks/cuda_graphs.py --steps 4 --set model.name=hpctrain:tiny_cnn
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from harness import run_job, run_job_arguments, run_job_settings

ROWS = {"eager": ["compile=false"],
        "compiled, default mode": ["compile=true", "compile_mode=default"],
        "compiled, CUDA graphs": ["compile=true", "compile_mode=reduce-overhead"]}
BASELINE = "compiled, default mode"


def job(recipe: str, output: Path, name: str, settings: list[str]) -> dict:
    """One `hpctrain run` in a process of its own; its summary."""
    return json.loads((run_job(recipe, output, name, settings) / "summary.json").read_text())


def describe(summary: dict) -> str:
    """What ran: the resolved mode, graphs compiled, CUDA graphs skipped and why."""
    system, compiled = summary.get("system") or {}, summary.get("compiled")
    if not compiled:
        return "eager"
    skips = int(compiled.get("cuda_graph_skips", 0))
    why = (compiled.get("cuda_graph_skip_reasons") or ["not said"])[-1] if skips else ""
    return (f"{system.get('compile_mode')}, {int(compiled['compiled_graphs'])} graphs"
            + (f", {skips} without CUDA graphs ({why[:80]})" if skips else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_job_arguments(parser, 200, "steps of each job")
    args = parser.parse_args()
    args.set = run_job_settings(args)
    common = [*args.set, f"train.max_steps={args.steps}", "train.eval_every_epochs=1000"]
    with tempfile.TemporaryDirectory() as scratch:
        summaries = {row: job(args.recipe, Path(scratch), f"run{i}", [*common, *settings])
                     for i, (row, settings) in enumerate(ROWS.items())}
    base = summaries[BASELINE]["samples_per_second"]
    first = next(iter(summaries.values()))
    print(f"{args.recipe} {' '.join(args.set)}: {args.steps} steps on "
          f"{first['system']['device_name']} ({first['precision']})")
    print(f"{'run':26s}{'samples/s':>12s}{'ratio':>8s}  what ran")
    for row, summary in summaries.items():
        rate = summary["samples_per_second"]
        print(f"{row:26s}{rate:12,.0f}{rate / base:8.2f}  {describe(summary)}")


if __name__ == "__main__":
    main()
