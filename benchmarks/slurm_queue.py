"""`hpctrain jobs` and `hpctrain status` against a full queue: 10, 100 and 1,000 pending jobs
(1x / 10x / 100x), on a real, throw-away Slurm cluster started here (tests/slurm_cluster.py,
other ports than the tests' own, so both can run side by side; needs root, as the tests do).

Each size (that many single jobs, and one array job of that many elements) is submitted held
(`sbatch --hold`, so nothing runs), then `hpctrain jobs` and `hpctrain status` of one job and
of the array job are timed as commands (the median of `--repeats`), with the Slurm client
calls each makes counted in-process, and the exponent of growth from 1x to 100x (time ~
size^exponent: 0 is flat, 1 linear).

    python benchmarks/slurm_queue.py --sizes 10 100 1000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from growth import TESTS, exponent



def submit_held(count: int, env: dict, array: bool = False) -> list[str]:
    """`count` held jobs (or one array job of `count` elements); their ids."""
    script = "#!/bin/bash\nsleep 1\n"
    if array:
        out = subprocess.run(["sbatch", "--parsable", "--hold", "-J", "bench-array",
                              f"--array=0-{count - 1}"], input=script, capture_output=True,
                             text=True, env=env, check=True).stdout
        return [out.strip().split(";")[0]]
    ids = []
    for _ in range(count):
        out = subprocess.run(["sbatch", "--parsable", "--hold", "-J", "bench"], input=script,
                             capture_output=True, text=True, env=env, check=True).stdout
        ids.append(out.strip().split(";")[0])
    return ids


def cancel_all(env: dict) -> None:
    subprocess.run(["scancel", "--me"], env=env, check=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and subprocess.run(
            ["squeue", "--me", "-h"], capture_output=True, text=True, env=env).stdout.strip():
        time.sleep(0.5)


def command_seconds(args: list[str], env: dict, repeats: int) -> float:
    """The median wall time of `hpctrain ARGS` as a user runs it."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True,
                       env=env, check=True)
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def client_calls(action) -> int:
    """How many Slurm client commands `action()` starts (in this process). Counted where every
    process starts (`subprocess.Popen`), under hpctrain's one runner of commands
    (hpctrain/commands.py), so that a change of door does not make the count read 0."""
    calls = []
    original = subprocess.Popen

    def counting(args, *rest, **kwargs):
        if args and Path(args[0]).name in ("squeue", "sacct", "scontrol", "sinfo"):
            calls.append(args[0])
        return original(args, *rest, **kwargs)

    subprocess.Popen = counting
    try:
        action()
    finally:
        subprocess.Popen = original
    return len(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(TESTS))
    from slurm_cluster import LocalSlurm

    from hpctrain.cluster import jobs

    rows: dict[str, list[float]] = {"jobs": [], "status, one job": [],
                                    "status, one array job": []}
    calls: dict[str, list[int]] = {name: [] for name in rows}
    with tempfile.TemporaryDirectory() as folder:
        cluster = LocalSlurm(Path(folder), name="hpctrainbench", port=17817)
        cluster.start()
        env = {**os.environ, "SLURM_CONF": str(cluster.conf)}
        os.environ["SLURM_CONF"] = str(cluster.conf)
        try:
            for size in args.sizes:
                single = submit_held(size, env)
                array = submit_held(size, env, array=True)[0]
                rows["jobs"].append(command_seconds(["jobs"], env, args.repeats))
                rows["status, one job"].append(
                    command_seconds(["status", single[0]], env, args.repeats))
                rows["status, one array job"].append(
                    command_seconds(["status", array], env, args.repeats))
                calls["jobs"].append(client_calls(lambda: jobs.queue()))
                calls["status, one job"].append(
                    client_calls(lambda: jobs.Job(single[0]).status()))
                calls["status, one array job"].append(
                    client_calls(lambda: jobs.Job(array).status()))
                cancel_all(env)
        finally:
            cluster.stop()
    print(f"slurm_queue: held jobs in a local Slurm queue (at each size: that many single "
          "jobs and one array job of that many elements), median of "
          f"{args.repeats} commands")
    header = "".join(f"{f'{size} s':>10}{'calls':>6}" for size in args.sizes)
    print(f"{'command':<24}{header}{'exponent':>10}")
    for name, seconds in rows.items():
        cells = "".join(f"{s:>10.2f}{c:>6}" for s, c in zip(seconds, calls[name]))
        print(f"{name:<24}{cells}{exponent(args.sizes, seconds):>10.2f}")


if __name__ == "__main__":
    main()
