"""How soon a requeued compiled run reaches its first step, with its compile cache kept in its
output folder (compile_cache=shared, the default; `run` keeps it in the run directory, the
same for a requeue) and without (a new node's empty cache, as torch's default /tmp folder
leaves a requeue).

Three jobs of `hpctrain run RECIPE compile=true`, each a process of its own:
1. cold: a new run, its cache empty, trained to --steps (an evaluation at its end, so every
   graph the run needs is compiled);
2. requeued: the same run resumed (resume=auto) to twice --steps, its kept cache read;
3. requeued without the kept cache: the same run resumed again, its kernels to be compiled
   into an empty folder;
4. a new run of the same recipe in the same output folder (a search's next trial, the next
   experiment), which compile_cache=shared starts warm.
Each job's way to its first step is read from run.json (`hpctrain goodput`'s figures:
imports, build, the checkpoint's load, compilation, when the first step ended); the ratio is
each requeue's first step against the cold start's.

    python benchmarks/compile_restart.py                 # the default recipe, as it is
    python benchmarks/compile_restart.py --steps 2 --set model.name=hpctrain:tiny_cnn
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from harness import run_job, run_job_arguments, run_job_settings

# run.json's split: the column's title
COLUMNS = {"imports": "imports", "build": "build", "resume_load": "load",
           "compilation": "compiling", "compile_cache_hits": "hits",
           "compile_cache_misses": "misses", "first_step": "1st step"}


def job(recipe: str, output: Path, settings: list[str], name: str = "restart") -> dict:
    """One `hpctrain run ... compile=true` in a process of its own; its start's split from
    run.json."""
    run = run_job(recipe, output, name, ["compile=true", *settings])
    return json.loads((run / "run.json").read_text())["starts"][-1]["split"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_job_arguments(parser, 20, "steps of the cold job")
    args = parser.parse_args()
    args.set = run_job_settings(args)
    with tempfile.TemporaryDirectory() as scratch:
        output, empty = Path(scratch) / "runs", Path(scratch) / "empty-cache"
        rows = {"cold start (a new run)": job(args.recipe, output, [
                    *args.set, f"train.max_steps={args.steps}"]),
                "requeued, cache kept (shared)": job(args.recipe, output, [
                    *args.set, f"train.max_steps={2 * args.steps}", "resume=auto"]),
                "requeued, cache not kept (a new node)": job(args.recipe, output, [
                    *args.set, f"train.max_steps={3 * args.steps}", "resume=auto",
                    f"compile_cache={empty}"]),
                "a new run in the same output folder": job(args.recipe, output, [
                    *args.set, f"train.max_steps={args.steps}"], name="another")}
    cold = rows["cold start (a new run)"]["first_step"]
    print(f"{args.recipe} compile=true {' '.join(args.set)} on {os.cpu_count()} CPUs "
          "(seconds from the job's start)")
    print(f"{'job':40s}" + "".join(f"{title:>10s}" for title in COLUMNS.values())
          + f"{'ratio':>7s}")
    for name, split in rows.items():
        print(f"{name:40s}" + "".join(f"{split.get(column, 0.0):10.1f}" for column in COLUMNS)
              + f"{split['first_step'] / cold:7.2f}")


if __name__ == "__main__":
    main()
