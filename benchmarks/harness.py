"""Shared by the benchmarks: hpctrain's real step loop fed from batches held in memory.

Evaluation and checkpointing are switched off (they are not the training step); everything
else, batch normalisation on the device, autocast, metric accumulation, the read-back at
logging intervals, the scheduler, runs exactly as in `hpctrain run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from hpctrain.config import load_config
from hpctrain.train import loop
from hpctrain.train.build import Parts, build_parts
from hpctrain.train.preemption import Stopper
from hpctrain.train.telemetry import Telemetry


def run_job_arguments(parser, steps: int, steps_help: str) -> None:
    """A benchmark of `hpctrain run` jobs: --recipe, --steps, --set and --cache-dir."""
    parser.add_argument("--recipe", default="default")
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    parser.add_argument("--set", nargs="*", default=[], help="recipe overrides (key=value)")
    parser.add_argument("--cache-dir", help="where the shapes dataset is made (default: the "
                        "recipe's data.shapes.cache_dir)")


def run_job_settings(args) -> list[str]:
    """The overrides of run_job_arguments: --set, and the shapes' folder of --cache-dir."""
    return [*args.set, *([f"data.shapes.cache_dir={args.cache_dir}"] if args.cache_dir else [])]


def run_job(recipe: str, output: Path, name: str, settings: list[str]) -> Path:
    """One `hpctrain run` in a process of its own (no report, no TensorBoard); its run
    directory. A job that fails ends the benchmark with its command and stderr's end."""
    command = [sys.executable, "-m", "hpctrain", "run", recipe, f"output_dir={output}",
               f"run_name={name}", "report=false", "tensorboard=false", *settings]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n"
                         f"{done.stderr[-3000:]}")
    return Path(output) / name


def make_batches(count: int, batch_size: int, image_size: int, num_classes: int,
                 pin: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """uint8 NHWC batches, as the DataLoader delivers them (DeviceBatcher permutes them)."""
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        images = torch.randint(0, 256, (batch_size, image_size, image_size, 3),
                               dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, num_classes, (batch_size,), generator=generator)
        batches.append((images.pin_memory(), labels.pin_memory()) if pin else (images, labels))
    return batches


def recipe_parts(recipe: str, overrides: list[str], output_dir: str) -> Parts:
    config = load_config(recipe, [f"output_dir={output_dir}", "data.num_workers=0",
                                  "tensorboard=false", *overrides])
    return build_parts(config)


def hpctrain_parts(overrides: list[str], output_dir: str) -> Parts:
    """The default recipe's parts on synthetic images."""
    return recipe_parts("default", ["data.dataset=synthetic", *overrides], output_dir)


def with_batches(parts: Parts, batches: list) -> Parts:
    """The same parts, trained from `batches` (one epoch = one pass over them)."""
    data = dataclasses.replace(parts.data, train_loader=batches)
    return dataclasses.replace(parts, data=data, steps_per_epoch=len(batches))


def time_hpctrain(parts: Parts, steps: int) -> float:
    """Seconds per optimiser step over `steps` steps of the real loop."""
    parts.total_steps = steps
    telemetry = Telemetry(parts.run_dir, steps, 0)
    saved = loop.evaluate_and_record, loop.run_record.save_checkpoint
    loop.evaluate_and_record = loop.run_record.save_checkpoint = lambda *args: None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            start = time.perf_counter()
            loop._run_steps(parts, loop.Progress(), loop.Clock(), telemetry,
                            Stopper(parts.distributed))
            if parts.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
    finally:
        loop.evaluate_and_record, loop.run_record.save_checkpoint = saved
        telemetry.close()
    return seconds / steps


def alternate(rounds: int, *runs) -> list[list[float]]:
    """Seconds per step of each of `runs`, round by round, forwards then backwards (ABBA),
    so that machine drift hits every side alike."""
    timings = {run: [] for run in runs}
    for round_ in range(rounds):
        for run in (runs if round_ % 2 == 0 else runs[::-1]):
            timings[run].append(run())
    return [timings[run] for run in runs]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def print_ratios(sides: list[tuple[str, list[float]]], unit: str, per_step: float,
                 decimals: int = 1) -> None:
    """The comparison table: each side's median ms per step, `unit`s per second (`per_step`
    of them a step) and its time as a ratio to the first side's."""
    width = max(24, max(len(label) for label, _ in sides) + 2)
    reference = median_ms(sides[0][1])
    print(f"{'loop':<{width}}{'median ms/step':>16}{unit + '/s':>11}{'time ratio':>12}")
    for label, samples in sides:
        med = median_ms(samples)
        print(f"{label:<{width}}{med:>16.{decimals}f}{per_step / med * 1e3:>11.0f}"
              f"{med / reference:>12.3f}")
