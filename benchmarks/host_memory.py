"""host_memory: CPU training with glibc's default malloc against hpctrain's kept heap.

glibc returns a freed block above its mmap threshold (at most 32 MiB) to the kernel, so a
step's large activations come back as fresh pages that fault and are zeroed every step.
hpctrain raises the threshold for CPU runs (train/hardware/system.py: keep_freed_host_memory). Each
row trains a shipped recipe twice with `hpctrain run`'s own loop, in fresh processes: once with
the switch disabled (the baseline, 1.00) and once as shipped, and prints samples/s, minor page
faults per step and the share of CPU time spent in the kernel.

    python benchmarks/host_memory.py [--recipes pointnet,default,tiny-lm] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile

CACHE_KEYS = ("data.shapes.cache_dir", "data.shapes3d.cache_dir", "data.arithmetic.cache_dir")


def child(mode: str, recipe: str, steps: int, overrides: list[str]) -> None:
    """One training run in this process; prints its figures as JSON."""
    from hpctrain.config import load_config
    from hpctrain.train.hardware import system
    from hpctrain.train.loop import train

    if mode == "default":
        system.keep_freed_host_memory = lambda: False
    with tempfile.TemporaryDirectory() as out:
        config = load_config(recipe, [
            f"output_dir={out}", "tensorboard=false", f"train.max_steps={steps}",
            f"train.log_every={max(1, steps // 4)}", "train.eval_every_epochs=1000",
            "checkpoint.every_epochs=1000", *overrides])
        before = resource.getrusage(resource.RUSAGE_SELF)
        summary = train(config)
        after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"samples_per_second": summary["samples_per_second"],
                      "faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
                      "kernel_share": (after.ru_stime - before.ru_stime) / max(cpu, 1e-9)}))


def measure(mode: str, recipe: str, steps: int, overrides: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", mode, "--recipes", recipe,
                           "--steps", str(steps), *[f"--set={o}" for o in overrides]],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{recipe} ({mode}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="pointnet,default,tiny-lm")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every recipe (repeatable)")
    parser.add_argument("--cache-dir", help="where the built-in datasets are generated")
    parser.add_argument("--child", choices=["default", "keep"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = list(args.set)
    if args.child:
        child(args.child, args.recipes, args.steps, overrides)
        return
    if args.cache_dir:
        overrides += [f"{key}={args.cache_dir}" for key in CACHE_KEYS]
    print(f"{'recipe':<10} {'heap':<14} {'samples/s':>10} {'ratio':>6} {'faults/step':>12} "
          f"{'kernel':>7}")
    for recipe in args.recipes.split(","):
        base = None
        for mode, label in (("default", "glibc default"), ("keep", "kept (hpctrain)")):
            row = measure(mode, recipe, args.steps, overrides)
            base = base or row["samples_per_second"]
            print(f"{recipe:<10} {label:<14} {row['samples_per_second']:>10.1f} "
                  f"{row['samples_per_second'] / base:>6.2f} {row['faults_per_step']:>12.0f} "
                  f"{row['kernel_share']:>7.0%}", flush=True)


if __name__ == "__main__":
    main()
