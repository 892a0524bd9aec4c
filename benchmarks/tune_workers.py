"""`hpctrain tune`'s workers under concurrency: 8 and 32 worker processes taking trials from
one study (the journal file in the search folder, and PostgreSQL), each trial finishing at
once, so that what is measured is the search's own cost per trial: the claim lock, the
study read, the sampler's proposal, the claim file and the result told back.

Checks what must hold at any concurrency: every trial of the budget completed once, none
lost (left RUNNING) and none run twice (two workers holding one trial number); a worker the
storage refuses (a database out of connections) is counted and its reason printed. The
throw-away PostgreSQL server allows 400 connections (SQLAlchemy keeps a pool per worker). Prints the
wall time, the worker-seconds per trial (wall x workers / trials: what a trial costs beyond
its training) and the exponent of that cost's growth over the budget sizes.

    python benchmarks/tune_workers.py --workers 8 32 --trials 64 256
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from growth import exponent, fresh_database, throwaway_postgres


def work(folder: str, slot: int, out: str) -> None:
    """One worker: take trials until none is left, telling each a value at once."""
    from hpctrain.tune.space import parse_all
    from hpctrain.tune.study import open_study, read_search
    from hpctrain.tune.worker import take_trial, tell

    search = read_search(Path(folder))
    parameters = parse_all(search.space)
    taken = []
    try:
        study = open_study(Path(folder), search, slot, parameters)
        while (claim := take_trial(study, search, Path(folder), str(slot),
                                   parameters)) is not None:
            tell(study, claim.trial, float(claim.params["optim.lr"]))
            taken.append(claim.trial)
    except Exception as err:  # a worker the storage refused: counted, as a user would see
        Path(out).write_text(json.dumps({"taken": taken, "error": str(err)}))
        return
    Path(out).write_text(json.dumps({"taken": taken, "error": None}))


def one_search(workers: int, trials: int, storage: str | None, sampler: str,
               folder: Path) -> dict:
    from optuna.trial import TrialState

    from hpctrain.tune.search import Options, prepare
    from hpctrain.tune.study import open_study, read_search

    folder, _ = prepare(None, [], Options(space=["optim.lr=loguniform(1e-4,1)"],
                                          trials=trials, sampler=sampler, storage=storage,
                                          folder=str(folder)))
    context = multiprocessing.get_context("fork")
    outs = [folder / f"taken-{slot}.json" for slot in range(workers)]
    started = time.perf_counter()
    processes = [context.Process(target=work, args=(str(folder), slot, str(out)))
                 for slot, out in enumerate(outs)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    wall = time.perf_counter() - started
    reports = [json.loads(out.read_text()) for out in outs]
    taken = [number for report in reports for number in report["taken"]]
    errors = [report["error"] for report in reports if report["error"]]
    study = open_study(folder, read_search(folder))
    states = [t.state for t in study.get_trials(deepcopy=False)]
    return {"wall": wall, "taken": len(taken), "twice": len(taken) - len(set(taken)),
            "completed": states.count(TrialState.COMPLETE),
            "lost": sum(s in (TrialState.RUNNING, TrialState.WAITING) for s in states),
            "refused": len(errors), "why": errors[0] if errors else None,
            "per_trial": wall * workers / trials}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--trials", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--sampler", default="tpe")
    parser.add_argument("--postgres", default="auto", help="'auto' (a throw-away server) or "
                        "'none'")
    parser.add_argument("--cache-dir", help="where the search folders are made")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.cache_dir))
    server = None
    if args.postgres == "auto":
        server = throwaway_postgres(root / "postgres", max_connections=400)
    rows = []
    try:
        for storage in ["journal", *(["PostgreSQL"] if server else [])]:
            for workers in args.workers:
                for trials in args.trials:
                    url = None if storage == "journal" else \
                        fresh_database(server.url, f"study_{workers}_{trials}")
                    place = root / f"search-{storage}-{workers}-{trials}"
                    rows.append((storage, workers, trials,
                                 one_search(workers, trials, url, args.sampler, place)))
    finally:
        if server:
            server.stop()
    print(f"tune_workers: {args.sampler} sampler, trials that end at once, "
          f"{os.cpu_count()} CPUs")
    print(f"{'storage':<12}{'workers':>8}{'trials':>8}{'wall s':>9}{'completed':>11}"
          f"{'lost':>6}{'twice':>7}{'refused':>9}{'s/trial':>9}{'exponent':>10}")
    for storage, workers, trials, r in rows:
        first = next(x for s, w, t, x in rows if s == storage and w == workers)
        smallest = min(t for s, w, t, _ in rows if s == storage and w == workers)
        growth = exponent([smallest, trials], [first["per_trial"], r["per_trial"]])
        print(f"{storage:<12}{workers:>8}{trials:>8}{r['wall']:>9.1f}{r['completed']:>11}"
              f"{r['lost']:>6}{r['twice']:>7}{r['refused']:>9}{r['per_trial']:>9.3f}"
              f"{growth:>10.2f}")
    for storage, workers, trials, r in rows:
        if r["why"]:
            print(f"{storage}, {workers} workers: {r['refused']} refused: {r['why']}")


if __name__ == "__main__":
    main()
