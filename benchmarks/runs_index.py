"""The runs index at scale: N generated run directories at each size (default 1,000, 10,000
and 100,000: 1x / 10x / 100x), indexed from nothing (the full scan), refreshed with nothing
changed, refreshed after 1 % of the runs started again, and the listing, usage and
leaderboard queries, on SQLite and on PostgreSQL. "Folder changed": the first refresh after a
run started or ended in the output directory (it lists the folder: a stat per finished run);
"nothing changed": a refresh after one that listed it (its runs not looked at).

Each (size, database) is measured in a process of its own, so its peak resident memory is
its own; the exponent of growth from the smallest size to the largest is printed beside
each operation (time ~ runs^exponent: 1 is linear, 0 flat). The refreshes show what
`hpctrain runs` costs on every call (a stat per file, no reading); `runs` the listing as the
command prints it (its default limit) and every row of it (`--limit 0`). Each run directory
holds what hpctrain writes: run.json, config.yaml, summary.json and a metrics.jsonl with 20
training and 5 evaluation records.

    python benchmarks/runs_index.py                         # 1k, 10k, 100k runs, SQLite and
                                                            # a throw-away PostgreSQL server
    python benchmarks/runs_index.py --runs 1000 --postgres postgresql://u@host/db
    python benchmarks/runs_index.py --postgres none         # SQLite only

A refresh lists the output directory only when its time changed (a run touches it when it
starts or ends), then only the folders of runs that may have changed: a finished run whose
folder is unchanged costs one stat; `--rescan` checks every run's files (a listing and four
stats).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from growth import exponent, fresh_database, in_child, throwaway_postgres
from hpctrain.cli.runs import LISTING_LIMIT
from hpctrain.runs.database import open_database
from hpctrain.runs.directory import mark_changed
from hpctrain.runs.index import Index

USERS, RECIPES = ("alice", "bob", "carla", "dmitri"), ("resnet50", "vit-b16", "gpt-350m")


def generate(root: Path, count: int, first: int = 0) -> None:
    """Run directories `first` to `count - 1`, finished, spread over users, recipes and a
    year (each seeded by its number, so a larger set holds the smaller ones)."""
    for n in range(first, count):
        rng = random.Random(n)
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


def settle(root: Path) -> None:
    """The output directory last changed a minute ago, as one where no run started or ended
    since (a refresh relies on a folder's time only once it is RACY_SECONDS old)."""
    os.utime(root, (time.time() - 60, time.time() - 60))


def timed(action) -> tuple[float, object]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def measure(url: str, root: Path, count: int) -> dict[str, float]:
    index = Index(open_database(url))
    seconds = {}
    seconds["full scan"], first = timed(lambda: index.refresh([root]))
    assert first.read == count, first
    settle(root)
    seconds["refresh, folder changed"], _ = timed(lambda: index.refresh([root]))
    seconds["refresh, nothing changed"], same = timed(lambda: index.refresh([root]))
    assert (same.read, same.unchanged) == (0, count), same
    seconds["refresh --rescan, nothing"], _ = timed(lambda: index.refresh([root], rescan=True))
    changed = sorted(root.iterdir())[:: 100]
    for run in changed:  # 1 % started again: run.json rewritten (by renaming) and the
        (run / "run.json.tmp").write_text((run / "run.json").read_text())  # folder touched,
        os.replace(run / "run.json.tmp", run / "run.json")  # as a run does
        mark_changed(run)
    seconds["refresh, 1 % restarted"], again = timed(lambda: index.refresh([root]))
    assert again.read == len(changed), again
    seconds["runs (listing as shown)"], _ = timed(lambda: index.runs(limit=LISTING_LIMIT))
    seconds["runs --limit 0 (every row)"], rows = timed(lambda: index.runs())
    assert len(rows) == count
    seconds["usage --by user"], rows = timed(lambda: index.usage("user"))
    assert sum(r["runs"] for r in rows) == count
    seconds["usage --by recipe"], _ = timed(lambda: index.usage("recipe"))
    seconds["leaderboard to 0.8"], _ = timed(
        lambda: index.leaderboard("resnet50", "val_accuracy", 0.8, True))
    index.db.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--postgres", default="auto",
                        help="a PostgreSQL URL, 'auto' (start a throw-away server) or 'none'")
    parser.add_argument("--cache-dir", help="where the run directories are generated")
    args = parser.parse_args()
    sizes = sorted(args.runs)
    work = Path(tempfile.mkdtemp(dir=args.cache_dir))
    server = throwaway_postgres(work / "postgres") if args.postgres == "auto" else None
    databases = {"SQLite": lambda size: str(work / f"index-{size}.sqlite")}
    if server:
        databases["PostgreSQL"] = lambda size: fresh_database(server.url, f"index_{size}")
    elif args.postgres != "none":  # your server: one size, indexed into the database given
        if len(sizes) > 1:
            parser.error("with --postgres URL, give one --runs size (the index is written "
                         "into that database, which this script does not empty)")
        databases["PostgreSQL"] = lambda size: args.postgres
    results = {name: [] for name in databases}
    memory = {name: [] for name in databases}
    try:
        done = 0
        for size in sizes:
            root = work / f"runs-{size}"
            if done:  # the larger set holds the smaller one: move it, then add the rest
                os.rename(work / f"runs-{done}", root)
            began = time.perf_counter()
            generate(root, size, first=done)
            print(f"{size:,} run directories ({size - done:,} generated in "
                  f"{time.perf_counter() - began:.1f} s), {os.cpu_count()} CPUs", flush=True)
            done = size
            for name, where in databases.items():
                seconds, added = in_child(lambda: measure(where(size), root, size))
                results[name].append(seconds)
                memory[name].append(added)
    finally:
        if server:
            server.stop()
    print_table(sizes, results, memory)


def print_table(sizes: list[int], results: dict, memory: dict) -> None:
    columns = "".join(f"{f'{size:,} s':>12}" for size in sizes)
    print(f"\n{'operation':<28}{'database':<12}{columns}{'us/run':>9}{'exponent':>10}")
    for operation in results["SQLite"][0]:
        for database, per_size in results.items():
            values = [seconds[operation] for seconds in per_size]
            cells = "".join(f"{value:>12.3f}" for value in values)
            print(f"{operation:<28}{database:<12}{cells}{values[-1] / sizes[-1] * 1e6:>9.1f}"
                  f"{exponent(sizes, values):>10.2f}")
    for database, added in memory.items():
        cells = "".join(f"{value:>12.0f}" for value in added)
        print(f"{'peak memory added (MB)':<28}{database:<12}{cells}{'':>9}"
              f"{exponent(sizes, added):>10.2f}")


if __name__ == "__main__":
    main()
