"""Shared by the cost-growth benchmarks (runs_index, pack_growth, slurm_queue, tune_workers):
a measurement in a process of its own with the memory it adds, the exponent of growth
between sizes, and throw-away PostgreSQL databases. Light on purpose: no torch."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"  # the throw-away servers live there


def in_child(action: Callable[[], object]) -> tuple[object, float]:
    """`action()` run in a forked child: its JSON-able result, and the MB it added to the
    child's peak resident memory (the parent's own memory and imports not counted)."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reading)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result = action()
        added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        with os.fdopen(writing, "w") as out:
            json.dump([result, added], out)
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading) as answer:
        result, added = json.load(answer)
    os.waitpid(pid, 0)
    return result, added


def exponent(sizes: list[int], values: list[float]) -> float:
    """e in value ~ size^e from the smallest size to the largest (1: linear, 0: flat);
    NaN where there is one size or a value is not positive."""
    if len(sizes) < 2 or sizes[0] == sizes[-1] or min(values[0], values[-1]) <= 0:
        return float("nan")
    return math.log(values[-1] / values[0]) / math.log(sizes[-1] / sizes[0])


def throwaway_postgres(folder: Path, max_connections: int = 50):
    """A PostgreSQL server of the tests' own (tests/postgres_server.py), started."""
    sys.path.insert(0, str(TESTS))
    from postgres_server import LocalPostgres

    return LocalPostgres(folder, max_connections=max_connections).start()


def fresh_database(server_url: str, name: str) -> str:
    """A new, empty database on the throw-away server; its URL."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + "/" + name
