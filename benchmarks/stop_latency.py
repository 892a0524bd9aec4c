"""How long a run takes from SIGTERM to a saved checkpoint, against Slurm's grace time.

Slurm sends SIGTERM to every process of a job it cancels or preempts, then SIGKILL KillWait
seconds later (30 by default): the checkpoint must be on disk by then. Each row starts
`hpctrain run` (two DataLoader workers, a checkpoint of the given size), lets it train, sends
SIGTERM to its whole process group as slurmstepd does, and reads `stop_seconds` from its
summary. The ratio is stop_seconds / KillWait: below 1 the save fits.

A second table presses Ctrl-C twice (SIGINT, then SIGINT 0.3 s later) with TensorBoard on, as
a user at a terminal does, and times the exit from the second press: the writers' close is
bounded (telemetry.CLOSE_SECONDS), so the ratio to that bound stays well below 1.

    python benchmarks/stop_latency.py                          # three sizes, up to ~0.9 GB
    python benchmarks/stop_latency.py --widths 8,8 --cache-dir /tmp/x     # one tiny row
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.train import telemetry


def _start(widths: str, folder: Path, cache: Path, extra: list[str]) -> subprocess.Popen:
    """A run in its own process group, returned once it has logged two training records."""
    command = [sys.executable, "-m", "hpctrain", "run", "default", f"output_dir={folder}",
               "run_name=run", f"data.shapes.cache_dir={cache}", "data.shapes.num_train=320",
               "data.shapes.num_val=40", "data.shapes.image_size=16", "data.images.image_size=16",
               "data.num_workers=2", "model.name=hpctrain:resnet_small",
               f"model.kwargs={{widths: [{widths}]}}", "train.batch_size=16",
               "train.max_steps=100000", "train.log_every=1", *extra]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    metrics = folder / "run" / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 2):
        if process.poll() is not None:
            sys.exit(f"the run ended before it was signalled:\n{process.stderr.read()[-2000:]}")
        time.sleep(0.05)
    return process


def stop_once(widths: str, folder: Path, cache: Path, async_save: bool) -> tuple[float, int]:
    """(seconds from SIGTERM to the checkpoint, checkpoint bytes) of one run."""
    run = folder / "run"
    process = _start(widths, folder, cache, ["tensorboard=false",
                                             f"checkpoint.async_save={str(async_save).lower()}"])
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=600)
    if process.returncode != 75:
        sys.exit(f"expected exit 75, got {process.returncode}:\n{err[-2000:]}")
    summary = json.loads((run / "summary.json").read_text())
    checkpoint, = (run / "checkpoints").glob("step_*")
    size = sum(p.stat().st_size for p in checkpoint.iterdir())
    return summary["stop_seconds"], size


def interrupt_twice(widths: str, folder: Path, cache: Path) -> float:
    """Seconds from a second Ctrl-C to the exit of a run with TensorBoard on."""
    process = _start(widths, folder, cache, ["tensorboard=true"])
    os.killpg(process.pid, signal.SIGINT)
    time.sleep(0.3)
    os.killpg(process.pid, signal.SIGINT)
    pressed = time.monotonic()
    _, err = process.communicate(timeout=600)
    seconds = time.monotonic() - pressed
    if process.returncode != 130 or not list((folder / "run" / "tb").glob("events.out*")):
        sys.exit(f"expected exit 130 and TensorBoard's events, got {process.returncode}:\n"
                 f"{err[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", nargs="+", default=["8,8", "16,256,512", "16,1024,2048"],
                        help="resnet_small widths per row (the last ones set the size)")
    parser.add_argument("--killwait", type=float, default=30.0)
    parser.add_argument("--async-save", action="store_true", help="checkpoint.async_save=true")
    parser.add_argument("--cache-dir", default="/tmp/hpctrain-bench-shapes")
    parser.add_argument("--presses", type=int, default=3,
                        help="runs stopped by Ctrl-C twice (the smallest widths)")
    args = parser.parse_args()
    rows = []
    for widths in args.widths:
        with tempfile.TemporaryDirectory() as scratch:
            seconds, size = stop_once(widths, Path(scratch), Path(args.cache_dir),
                                      args.async_save)
        rows.append((widths, size, seconds))
    print(f"stop_latency: SIGTERM to the process group -> checkpoint saved; KillWait "
          f"{args.killwait:g} s; async_save {args.async_save}")
    print(f"{'model widths':<16}{'checkpoint MB':>15}{'stop s':>9}{'/ KillWait':>12}")
    for widths, size, seconds in rows:
        print(f"{widths:<16}{size / 1e6:>15.1f}{seconds:>9.2f}{seconds / args.killwait:>12.3f}")
    exits = []
    for _ in range(args.presses):
        with tempfile.TemporaryDirectory() as scratch:
            exits.append(interrupt_twice(args.widths[0], Path(scratch), Path(args.cache_dir)))
    bound = telemetry.CLOSE_SECONDS
    print(f"\nCtrl-C twice, TensorBoard on: the second press -> exit 130; the writers' close "
          f"bound {bound:g} s")
    print(f"{'press':<16}{'exit s':>9}{'/ bound':>10}")
    for number, seconds in enumerate(exits, 1):
        print(f"{number:<16}{seconds:>9.2f}{seconds / bound:>10.3f}")


if __name__ == "__main__":
    main()
