"""A search's settings and its Optuna study: what `hpctrain tune` writes into the search's
folder (tune.json) and how every process opens the same study from there.

Storage: by default Optuna's journal in the search folder (study.journal): one append-only
file whose writers take a symlink lock, which NFS, Lustre and GPFS make atomic (flock is
missing on some Lustre mounts) and which a killed writer cannot hold for ever (the lock's
grace period). Or a database URL (PostgreSQL) for a team's server. SQLite is refused where
it breaks: on a shared file system (its locks are not safe there: "database disk image is
malformed") and in array jobs, whose nodes do not share a local disk.

Read by the tune worker, `tune status`, and a trial's own training (train/trial.py), which
reports its evaluations; nothing here runs training.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpctrain.errors import ConfigError
from hpctrain.readers import (TEXT, TIME, Unreadable, field_problem, list_of, one_of, optional,
                              parse_json, read_capped, read_text_capped, whole)
from hpctrain.writers import refuse_link, write_whole

SETTINGS = "tune.json"
JOURNAL = "study.journal"
SQLITE_FILE = "study.db"  # --storage sqlite
LOCK_GRACE_SECONDS = 30  # a journal or claims lock older than this was left by a killed writer
SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("median", "hyperband", "none")
# summary.json's numbers a search can optimise (a test checks a run's summary holds them)
OBJECTIVES = ("best_val_accuracy", "final_val_accuracy", "best_val_loss", "best_val_perplexity",
              "samples_per_second", "wall_seconds", "device_hours", "energy_joules",
              "tokens_per_second", "images_per_second", "samples_per_joule", "mfu",
              # your own tensors' (tasks/regression.py, multilabel.py, segmentation.py)
              "final_val_mse", "final_val_mae", "final_val_r2", "final_val_f1",
              "final_val_precision", "final_val_recall", "final_val_exact_match",
              "final_val_miou")
SHARED_FILE_SYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph",
                       "glusterfs", "fuse.glusterfs", "panfs", "wekafs", "fuse.sshfs")


@dataclass
class Search:
    """tune.json: everything a worker needs to run the search's trials."""

    recipe: str | None
    overrides: list[str]
    space: list[str]  # the --space specs (tune/space.py)
    objective: str  # a summary.json key
    direction: str  # maximize | minimize
    trials: int
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int = 0
    storage: str | None = None  # None: the journal file in the search folder
    study_name: str = "hpctrain"
    processes_per_trial: int = 1  # local: torchrun processes; Slurm: the element's tasks
    created: float = field(default_factory=time.time)
    # --reduce: what makes each trial cheaper (fewer epochs, a subset): the trials' only,
    # left out of best.yaml and named there
    reductions: list[str] = field(default_factory=list)

    @property
    def for_trials(self) -> list[str]:
        """The overrides every trial runs with: the search's settings, then its reductions."""
        return [*self.overrides, *self.reductions]

    @property
    def metric(self) -> str | None:
        """The evaluation record's key the trial reports at each evaluation, for pruning:
        best_val_accuracy and final_val_accuracy report val_accuracy; None for a figure that
        only the end of a run knows (samples_per_second)."""
        for prefix in ("best_", "final_"):
            if self.objective.startswith(prefix + "val_"):
                return self.objective.removeprefix(prefix)
        return None

    def save(self, folder: Path) -> None:
        check_settings(self, SEARCH_RULES, "the search")
        write_whole(folder / SETTINGS, json.dumps(asdict(self), indent=1) + "\n")



MOST_TRIALS = 100_000  # a search's budget: far above what a cluster's allocation trains
SETTINGS_CAP = 1 << 20  # tune.json, scale.json: a few hundred bytes as hpctrain writes them
# tune.json's fields as hpctrain writes them: read back, a field that breaks one is named
SEARCH_RULES = {
    "recipe": optional(TEXT), "overrides": list_of(TEXT), "space": list_of(TEXT),
    "objective": one_of(*OBJECTIVES), "direction": one_of("maximize", "minimize"),
    "trials": whole(1, MOST_TRIALS), "sampler": one_of(*SAMPLERS), "pruner": one_of(*PRUNERS),
    "seed": whole(0, 2**31 - 1), "storage": optional(TEXT), "study_name": TEXT,
    "processes_per_trial": whole(1, 4096), "created": TIME, "reductions": list_of(TEXT)}


def read_search(folder: Path) -> Search:
    search = read_settings(folder, SETTINGS, Search, SEARCH_RULES, "a search folder",
                           "hpctrain tune RECIPE --space ...")
    own_storage(search.storage, Path(folder), f"{Path(folder) / SETTINGS}'s storage")
    return search


def read_settings(folder: Path, name: str, build, rules: dict, what: str, start: str):
    """`build(**settings)` from the JSON file `name` of a study's folder (tune.json,
    scale.json), read through readers.py (a regular file, not a link, of at most
    SETTINGS_CAP bytes) and held to `rules` (each field of the dataclass `build`): a folder
    without it, or a file given as the folder, is `what` not, and damage is named, each in one
    line."""
    path = Path(folder) / name
    try:
        settings = parse_json(read_capped(path, SETTINGS_CAP))
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{folder}: not {what} (no {name}); start one with {start}") \
            from None
    except Unreadable as err:
        raise ConfigError(f"{path} {err}; it is written by hpctrain ({start} makes a new "
                          "one)") from None
    except OSError as err:
        raise ConfigError(f"{path} cannot be read ({err.strerror or err})") from None
    except ValueError:
        settings = None
    fields = {f.name: f for f in dataclasses.fields(build)}
    why = "it is not a JSON object (cut short?)" if not isinstance(settings, dict) else \
        next((f"{key[:40]!r} is not one of its fields" for key in settings
              if key not in fields), None) or field_problem(settings, rules, tuple(
                  key for key, f in fields.items() if f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING))
    if why is not None:
        raise ConfigError(f"{path} is damaged: {why}; it is written by hpctrain ({start} "
                          "makes a new one)")
    return build(**settings)


def check_settings(settings, rules: dict, what: str) -> None:
    """Settings about to be written hold the rules they are read back with: what breaks one
    is named as `what`'s (a budget past MOST_TRIALS), before the file is written."""
    why = field_problem(dataclasses.asdict(settings), rules)
    if why is not None:
        raise ConfigError(f"{what}: {why}")


def objective(text: str) -> tuple[str, str]:
    """'best_val_accuracy:max' -> (key, maximize)."""
    key, _, way = text.partition(":")
    directions = {"max": "maximize", "maximize": "maximize", "min": "minimize",
                  "minimize": "minimize"}
    if key not in OBJECTIVES:
        raise ConfigError(f"--objective {text!r}: {key!r} is not a figure of summary.json "
                          f"that a search can optimise; use one of {', '.join(OBJECTIVES)}")
    if way not in directions:
        raise ConfigError(f"--objective {text!r}: end with :max or :min, e.g. "
                          f"{key}:{'min' if 'loss' in key or 'seconds' in key else 'max'}")
    return key, directions[way]


def file_system_type(path: Path) -> str | None:
    """The type of the file system holding `path` (from /proc/mounts; None elsewhere)."""
    try:
        mounts = read_text_capped(Path("/proc/mounts"), 16 << 20).splitlines()
    except (OSError, ValueError):
        return None
    path, best, kind = str(Path(path).resolve()), "", None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3:
            point = parts[1].replace("\\040", " ")
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best, kind = point, parts[2]
    return kind


def check_storage(url: str | None, array: bool, folder: Path) -> str | None:
    """The storage URL of a new search in `folder` as Optuna takes it; refused where it would
    break. `sqlite` is study.db in the folder."""
    if url is None:
        return None
    if url == "sqlite" or url.startswith("sqlite:"):
        if array:
            raise ConfigError(f"--storage {url}: the array's nodes do not share a local disk, "
                              "and SQLite on a shared file system corrupts under concurrent "
                              "writers; leave --storage out (a journal file in the search "
                              "folder) or give a PostgreSQL URL")
        where = Path(folder) / SQLITE_FILE if url == "sqlite" else \
            Path(url.split(":///", 1)[-1]).expanduser().absolute()
        kind = file_system_type(where.parent)
        if kind in SHARED_FILE_SYSTEMS:
            raise ConfigError(f"--storage {url}: {where} is on a shared file system ({kind}), "
                              "where SQLite's locks are not safe; leave --storage out (a "
                              "journal file, safe there) or give a PostgreSQL URL")
        url = f"sqlite:///{where}"
        own_storage(url, folder, "--storage")
        return url
    if url.startswith(("postgresql:", "postgres:")):
        # psycopg 3 (hpctrain[postgres]), not SQLAlchemy's default psycopg2
        scheme, rest = url.split(":", 1)
        return f"postgresql+psycopg:{rest}" if "+" not in scheme else url
    if url.startswith("postgresql+") or url.startswith("mysql"):
        return url
    raise ConfigError(f"--storage {url}: give a PostgreSQL URL (postgresql://user@host/db), "
                      "sqlite (study.db in the search's folder), or leave it out for a "
                      "journal file in the search folder")


def own_storage(url: str | None, folder: Path, what: str) -> None:
    """Refuse a storage that is not the search's own: the journal (None), a database
    server's URL, or a SQLite file inside the search's folder. A tune.json naming a SQLite
    file elsewhere made even `tune status` create a database there (or add Optuna's tables to
    another program's)."""
    if url is None or url.startswith(("postgresql", "mysql")):
        return
    if url.startswith("sqlite:///"):
        where = Path(url.removeprefix("sqlite:///"))
        if where.is_absolute() and where.parent.resolve() == Path(folder).resolve():
            return
    raise ConfigError(f"{what} {url[:200]!r} is not the search's own storage: a search keeps "
                      "its study in a journal file in its folder, a SQLite file there "
                      "(--storage sqlite) or a PostgreSQL database")


def open_storage(folder: Path, url: str | None, create: bool = True):
    """The study's storage: the journal file in `folder`, or the database at `url`. Without
    `create` (a verb that only reads), the journal or the SQLite file must be there already:
    nothing is made."""
    import optuna
    from optuna.storages.journal import JournalFileSymlinkLock, JournalStorage

    from hpctrain.tune.journal import StudyJournal, replayed

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if url is None:
        path = Path(folder) / JOURNAL
        lock = JournalFileSymlinkLock(str(path), grace_period=LOCK_GRACE_SECONDS)
        return replayed(lambda: JournalStorage(StudyJournal(path, lock, create)), path)
    if url.startswith("sqlite:///"):
        where = Path(url.removeprefix("sqlite:///"))
        if where.is_symlink():
            raise refuse_link(where)
        if not create and not where.is_file():
            raise ConfigError(f"{where} is missing: the search's study is kept there")
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as err:  # SQLAlchemy's errors: the server, the driver, the password
        raise ConfigError(f"cannot open the study's database: {_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def sampler(search: Search, slot: int, parameters: list):
    """The sampler of one worker: the search's seed and the worker's slot, so that workers
    do not propose the same first trials; TPE as a constant liar, so that running trials
    keep the others away from their point."""
    import optuna

    seed = search.seed + 1009 * slot
    startup = min(10, max(3, search.trials // 4))  # TPE's random start, for a small budget
    if search.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True,
                                          n_startup_trials=startup)
    if search.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if search.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=startup,
                                            warn_independent_sampling=False)
    grid = {p.key: p.grid() for p in parameters}
    return optuna.samplers.GridSampler(grid, seed=seed)


def pruner(search: Search):
    import optuna

    if search.pruner == "none" or search.metric is None:
        return optuna.pruners.NopPruner()
    if search.pruner == "hyperband":  # the resource: evaluations
        return optuna.pruners.HyperbandPruner(min_resource=1, reduction_factor=3)
    return optuna.pruners.MedianPruner(n_startup_trials=max(1, min(5, search.trials // 4)))


def grid_size(parameters: list) -> int:
    sizes = [p.grid() for p in parameters]
    if any(s is None for s in sizes):
        ranged = [p.key for p, s in zip(parameters, sizes) if s is None]
        raise ConfigError(f"--sampler grid: {', '.join(ranged)} is a continuous range; give "
                          "choice(...), int(LOW,HIGH) or uniform(LOW,HIGH,STEP)")
    return math.prod(len(s) for s in sizes)


def open_study(folder: Path, search: Search, slot: int = 0, parameters: list | None = None,
               create: bool = True):
    """The search's study, created on first use, with this worker's sampler and the
    search's pruner. Without `create` (a verb that only reads), the study must be recorded
    already: neither its storage nor its first record is made."""
    import optuna

    from hpctrain.tune.space import parse_all

    parameters = parameters if parameters is not None else parse_all(search.space)
    storage = open_storage(folder, search.storage, create)
    chosen = dict(study_name=search.study_name, storage=storage,
                  sampler=sampler(search, slot, parameters), pruner=pruner(search))
    if create:
        return optuna.create_study(direction=search.direction, load_if_exists=True, **chosen)
    try:
        return optuna.load_study(**chosen)
    except KeyError:
        raise ConfigError(f"{folder}: its storage holds no study {search.study_name!r} (the "
                          "search has not started; hpctrain tune --dir DIR starts it)") \
            from None
