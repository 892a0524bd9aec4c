"""The runs index at scale: N generated run directories (default 10,000), indexed from
nothing (the full scan), refreshed with nothing changed, refreshed after 1 % of the runs
started again, and the usage and leaderboard queries, on SQLite and on PostgreSQL.

The baseline is the full scan on SQLite; every other row is a ratio to it. The refreshes show
what `hpctrain runs` costs on every call (a stat per file, no reading); the queries what the
usage and leaderboard verbs add. Each run directory holds what hpctrain writes: run.json,
config.yaml, summary.json and a metrics.jsonl with 20 training and 5 evaluation records.

    python benchmarks/runs_index.py                       # 10,000 runs, SQLite and a
                                                          # throw-away PostgreSQL server
    python benchmarks/runs_index.py --runs 1000 --postgres postgresql://u@host/db
    python benchmarks/runs_index.py --postgres none       # SQLite only

A refresh lists only the folders of runs that may have changed: a finished run whose folder
is unchanged costs one stat; `--rescan` checks every run's files (a listing and four stats).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.runs.database import open_database
from hpctrain.runs.index import Index

USERS, RECIPES = ("alice", "bob", "carla", "dmitri"), ("resnet50", "vit-b16", "gpt-350m")


def generate(root: Path, count: int, seed: int = 0) -> None:
    """`count` finished run directories, spread over users, recipes and a year."""
    rng = random.Random(seed)
    for n in range(count):
        run = root / f"run-{n:06d}"
        run.mkdir(parents=True)
        started = 1767225600 + rng.uniform(0, 365 * 86400)
        gpus = rng.choice((1, 4, 8, 16))
        hours = rng.uniform(0.1, 40)
        (run / "config.yaml").write_text(f"name: {rng.choice(RECIPES)}\ntrain:\n  "
                                         f"batch_size: {rng.choice((64, 128, 256))}\n")
        (run / "run.json").write_text(json.dumps({
            "run_id": f"bench-{n:06d}", "recipe": rng.choice(RECIPES), "created": started,
            "user": rng.choice(USERS), "cluster": rng.choice(("jz", "grete")),
            "starts": [{"time": started, "job_id": str(100000 + n), "world_size": gpus,
                        "gpus": gpus, "gpu_model": "NVIDIA H100", "hosts": ["n1"]}]}))
        lines = [json.dumps({"kind": "train", "step": s * 50, "time": started + s * 60,
                             "loss": 2.0 / (s + 1)}) for s in range(1, 21)]
        lines += [json.dumps({"kind": "eval", "step": e * 200, "time": started + e * 240,
                              "val_accuracy": min(0.99, 0.5 + e * rng.uniform(0.05, 0.1)),
                              "elapsed_seconds": e * 240.0, "device_hours": e * hours / 5,
                              "energy_joules": e * hours * 7e5 / 5}) for e in range(1, 6)]
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (run / "summary.json").write_text(json.dumps({
            "status": rng.choice(("completed",) * 8 + ("failed", "preempted")),
            "device_hours": hours * gpus, "energy_joules": hours * gpus * 7e5,
            "best_val_accuracy": 0.9, "steps": 1000, "device": "NVIDIA H100",
            "world_size": gpus}))


def timed(action) -> tuple[float, object]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def measure(url: str, root: Path, count: int) -> dict[str, float]:
    index = Index(open_database(url))
    seconds = {}
    seconds["full scan"], first = timed(lambda: index.refresh([root]))
    assert first.read == count, first
    seconds["refresh, nothing changed"], _ = timed(lambda: index.refresh([root]))
    seconds["refresh --rescan, nothing"], _ = timed(lambda: index.refresh([root], rescan=True))
    changed = sorted(root.iterdir())[:: 100]
    for run in changed:  # 1 % started again: run.json rewritten (by renaming, as a run does)
        (run / "run.json.tmp").write_text((run / "run.json").read_text())
        os.replace(run / "run.json.tmp", run / "run.json")
    seconds["refresh, 1 % restarted"], again = timed(lambda: index.refresh([root]))
    assert again.read == len(changed), again
    seconds["usage --by user"], rows = timed(lambda: index.usage("user"))
    assert sum(r["runs"] for r in rows) == count
    seconds["leaderboard to 0.8"], _ = timed(
        lambda: index.leaderboard("resnet50", "val_accuracy", 0.8, True))
    index.db.close()
    return seconds


def throwaway_postgres(folder: Path):
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from postgres_server import LocalPostgres

    return LocalPostgres(folder).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--postgres", default="auto",
                        help="a PostgreSQL URL, 'auto' (start a throw-away server) or 'none'")
    parser.add_argument("--cache-dir", help="where the run directories are generated")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.cache_dir))
    root = work / "runs"
    began = time.perf_counter()
    generate(root, args.runs)
    print(f"{args.runs:,} run directories generated in {time.perf_counter() - began:.1f} s "
          f"({root}), {os.cpu_count()} CPUs")
    results = {"SQLite": measure(str(work / "index.sqlite"), root, args.runs)}
    server = None
    if args.postgres == "auto":
        server = throwaway_postgres(work / "postgres")
    try:
        url = server.url if server else None if args.postgres == "none" else args.postgres
        if url:
            results["PostgreSQL"] = measure(url, root, args.runs)
    finally:
        if server:
            server.stop()
    baseline = results["SQLite"]["full scan"]
    print(f"\n{'operation':<28}{'database':<12}{'seconds':>10}{'per run (us)':>14}"
          f"{'x full scan':>13}")
    for operation in results["SQLite"]:
        for database, seconds in results.items():
            value = seconds[operation]
            print(f"{operation:<28}{database:<12}{value:>10.3f}"
                  f"{value / args.runs * 1e6:>14.1f}{value / baseline:>13.3f}")


if __name__ == "__main__":
    main()
