"""What a `python -m hpctrain` the test suite starts costs, started fresh or warm.

The suite starts a few hundred `hpctrain` processes; tests/warm_starts.py forks them from a
process that has imported what every run imports. Each row starts the same tiny run (a
16-pixel shapes set, hpctrain:tiny_cnn, one epoch of 10 steps) ROUNDS times, one after the
other, and reports the median seconds from the start to its exit status, against the cold
start. The first warm start also pays for the warm process's own start (its row says it).

    python benchmarks/warm_starts.py                 # 5 rounds
    python benchmarks/warm_starts.py --rounds 1 --cache-dir /tmp/x
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import warm_starts  # noqa: E402  (the suite's helper, beside its tests)


def _tiny_run(folder: Path, cache: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "hpctrain", "run", "default", f"output_dir={folder}",
            f"run_name={name}", f"data.shapes.cache_dir={cache}", "data.shapes.num_train=160",
            "data.shapes.num_val=40", "data.shapes.image_size=16", "data.images.image_size=16",
            "data.num_workers=0", "model.name=hpctrain:tiny_cnn", "train.batch_size=16",
            "train.epochs=1", "tensorboard=false", "report=false"]


def _timed(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"exit {done.returncode}:\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        cache = args.cache_dir or folder / "cache"
        _timed(_tiny_run(folder, cache, "dataset"))  # the shapes set made once, not timed
        cold = [_timed(_tiny_run(folder, cache, f"cold-{i}")) for i in range(args.rounds)]
        warm_starts.install()
        try:
            first = _timed(_tiny_run(folder, cache, "warm-first"))
            warm = [_timed(_tiny_run(folder, cache, f"warm-{i}")) for i in range(args.rounds)]
        finally:
            warm_starts.uninstall()
    base = statistics.median(cold)
    print(f"{'start':<44}{'seconds':>9}{'ratio':>8}")
    print(f"{'cold (a fresh interpreter)':<44}{base:>9.2f}{1:>8.2f}")
    print(f"{'warm, the first (starts the warm process)':<44}{first:>9.2f}{first / base:>8.2f}")
    median = statistics.median(warm)
    print(f"{'warm (forked from it)':<44}{median:>9.2f}{median / base:>8.2f}")
    print(f"median of {args.rounds} round(s) each, one after the other")


if __name__ == "__main__":
    main()
