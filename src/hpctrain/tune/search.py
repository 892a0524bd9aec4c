"""`hpctrain tune`: prepare a search (checked in full before anything runs), then run its
workers here, one after another or N at a time, each on its own share of the cores and GPUs.
The Slurm side (one array job of workers) is tune/submit.py.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import ConfigError, ExitCode
from hpctrain.runs.directory import stamp
from hpctrain.tune.space import check_against, parse_all
from hpctrain.tune.study import (SEARCH_RULES, SETTINGS, Search, check_settings, check_storage,
                                 grid_size, objective, open_study, read_search)
from hpctrain.tune.worker import Launch, Worker, torchrun

RESERVED = ("run_name=", "resume=", "trial.")  # the worker sets these per trial


@dataclass
class Options:
    space: list[str]
    trials: int | None = None
    objective: str | None = None  # KEY:max|min; default by task
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int = 0
    storage: str | None = None
    folder: str | None = None
    processes_per_trial: int = 1
    reductions: list[str] = field(default_factory=list)  # --reduce: the trials' only


def prepare(recipe: str | None, overrides: list[str], options: Options,
            array: bool = False) -> tuple[Path, Search]:
    """Check everything (recipe, space, objective, storage), create the search folder and
    its study, or continue the search already in options.folder (same settings, the budget
    may grow). Returns the folder and its settings."""
    from hpctrain.config import load_config

    if options.folder and not (recipe or overrides or options.space or options.reductions) \
            and \
            os.path.lexists(Path(options.folder) / SETTINGS):  # `tune --dir DIR`: continue it
        folder = Path(options.folder).expanduser().absolute()
        search = read_search(folder)
        open_study(folder, search, create=False)  # its record is there and whole
        search.trials = max(search.trials, options.trials or 0)
        search.save(folder)
        return folder, search
    trial_overrides = [*overrides, *options.reductions]
    config = load_config(recipe, trial_overrides)
    for text in trial_overrides:
        if text.startswith(RESERVED):
            raise ConfigError(f"{text}: hpctrain tune sets {text.split('=')[0]} for each trial; "
                              "choose the search's folder with --dir")
    parameters = parse_all(options.space)
    check_against(parameters, lambda extra: load_config(recipe, [*trial_overrides, *extra]))
    key, direction = objective(options.objective or config.task_spec.objective)
    folder = Path(options.folder) if options.folder else \
        Path(config.output_dir) / f"{config.name}-tune-{stamp()}"
    folder = folder.expanduser().absolute()
    storage = check_storage(options.storage, array, folder)
    trials = options.trials
    if options.sampler == "grid":
        size = grid_size(parameters)
        trials = size if trials is None else min(trials, size)
    if trials is None or trials < 1:
        raise ConfigError("--trials N: how many trials the search may run (1 or more)")
    search = Search(recipe=recipe, overrides=list(overrides), space=list(options.space),
                    objective=key, direction=direction, trials=trials,
                    sampler=options.sampler, pruner=options.pruner, seed=options.seed,
                    storage=storage, processes_per_trial=options.processes_per_trial,
                    reductions=list(options.reductions))
    check_settings(search, SEARCH_RULES, "the search")
    if os.path.lexists(folder / SETTINGS):  # whatever is there: read, or named damaged
        search = _continued(folder, search)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    open_study(folder, search, 0, parameters)  # created now: a bad database fails here
    search.save(folder)
    return folder, search


def _continued(folder: Path, wanted: Search) -> Search:
    """The search already in `folder`, with the new budget; refused when it searched
    something else."""
    kept = read_search(folder)
    for name in ("recipe", "overrides", "reductions", "space", "objective", "direction",
                 "sampler", "pruner", "seed", "storage"):
        if getattr(kept, name) != getattr(wanted, name):
            raise ConfigError(f"--dir {folder} holds a search with another {name} "
                              f"({getattr(kept, name)!r}, not {getattr(wanted, name)!r}); "
                              "give the same settings to continue it, or another --dir")
    kept.trials = max(kept.trials, wanted.trials)
    kept.processes_per_trial = wanted.processes_per_trial
    return kept


def local_launches(parallel: int, processes: int) -> list[Launch]:
    """Each slot's share of this machine: its cores (the trials' DataLoaders size themselves
    by them) and, with GPUs, `processes` of them; torchrun for more than one process."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    share = len(cores) // parallel
    gpus = _gpu_count()
    launches = []
    for slot in range(parallel):
        environment = {"OMP_NUM_THREADS": str(max(1, share or 1))}
        if gpus:
            devices = [(slot * processes + i) % gpus for i in range(processes)]
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        launches.append(Launch(torchrun(processes), environment,
                               cores[slot * share:(slot + 1) * share] if share else None,
                               signal.SIGTERM if processes > 1 else None))
    return launches


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no CUDA: no GPUs
        return 0


def run_locally(folder: Path, parallel: int, say=print) -> int:
    """Run `parallel` workers here until the budget is spent. Ctrl-C stops every running
    trial with a checkpoint (the recipe's preemption signal): the same command continues
    them. DONE, STOPPED (stopped early) or FAILED (trials kept failing)."""
    from hpctrain.config import load_config

    search = read_search(folder)
    stop_signal = load_config(search.recipe, search.for_trials).preemption.signal
    lock = threading.Lock()

    def said(text: str) -> None:
        with lock:
            say(text)

    launches = local_launches(parallel, search.processes_per_trial)
    workers = [Worker(folder, str(slot), launches[slot], said, getattr(signal, stop_signal))
               for slot in range(parallel)]
    codes = [ExitCode.FAILED] * parallel  # a worker that raised (its traceback is printed)

    # each worker's end, waited for on events: Python 3.11's Thread.join, interrupted by a
    # Ctrl-C, releases the lock of a thread still running and marks it ended (bpo-45274's
    # handling), so tune ended with 75 before its trial had saved
    ended = [threading.Event() for _ in range(parallel)]

    def work(slot: int) -> None:
        try:
            codes[slot] = workers[slot].run()
        finally:
            ended[slot].set()

    for slot in range(parallel):
        threading.Thread(target=work, args=(slot,), name=f"tune-slot-{slot}").start()
        time.sleep(0.2)  # the first takes the lock first: trial numbers follow the slots
    try:
        _until_set(ended)
    except KeyboardInterrupt:
        said("hpctrain tune: stopping: the running trials save a checkpoint first")
        for worker in workers:
            worker.stop()
        while True:  # the trials' own bounds end them; a second Ctrl-C does not cut the save
            try:
                _until_set(ended)
                break
            except KeyboardInterrupt:
                said("hpctrain tune: still stopping: the running trials finish saving")
        return ExitCode.STOPPED
    return max(codes)  # STOPPED above FAILED above DONE


def _until_set(events: list[threading.Event]) -> None:
    """Every event set; a signal's exception may come out of any wait."""
    for event in events:
        while not event.wait(0.5):
            pass
