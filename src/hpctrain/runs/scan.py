"""Reading one run directory into the index's row: what the run is, where it stands, what it
spent, and its evaluations (for the leaderboard's time to target).

The run directory is the truth; this only reads it, and never fails on it: a summary.json cut
short is the row's `problem` (status "damaged"), a folder a run started in but never finished
is "running" (then "lost" once its heartbeat is old), one with only a job script is
"submitted", a line of metrics.jsonl that is not JSON is skipped and counted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

from hpctrain.runs.directory import (CONFIG, IDENTITY, JOB_SCRIPT, METRICS, RUN_STATUSES,
                                    SUMMARY, RunDir, modified)
from hpctrain.readers import COUNT, TEXT
from hpctrain.runs.goodput import account
from hpctrain.runs.identity import config_hash, job_chain, read_identity

# a live run touches run.json every minute (identity.Heartbeat); silence this long is a loss
LOST_AFTER_SECONDS = 15 * 60
FINAL = RUN_STATUSES  # a summary says how the run ended
RESUMABLE = ("preempted", "hung")  # a job of the run ended, and the run goes on (requeued)
# the run's figures kept as columns (the rest stays in the summary JSON)
RUN_FILES = {CONFIG, IDENTITY, METRICS, SUMMARY, JOB_SCRIPT}  # any of them: a run's folder
BEST_METRICS = (("best_val_accuracy", "max"), ("best_val_loss", "min"),
                ("best_val_perplexity", "min"))


def signature(path: Path) -> str:
    """What changes when a run writes: its files' sizes and modification times."""
    parts = []
    for name in (IDENTITY, CONFIG, METRICS, SUMMARY):
        try:
            stat = os.stat(path / name)
            parts.append(f"{stat.st_mtime_ns}:{stat.st_size}")
        except OSError:
            parts.append("-")
    return "|".join(parts)


def _text(value) -> str | None:
    """A summary's or configuration's text for a column; anything else (damage) is none."""
    return value if TEXT.holds(value) else None


def _count(value) -> int | None:
    return value if COUNT.holds(value) else None


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def evaluations(records: list[dict]) -> list[tuple]:
    """(step, metric, value, elapsed_seconds, device_hours, energy_joules) per val_* figure of
    each evaluation. Runs from before these were recorded: elapsed from the first record."""
    first = next((r.get("time") for r in records if _number(r.get("time"))), None)
    rows = []
    for record in records:
        if record.get("kind") != "eval" or "step" not in record:
            continue
        elapsed = _number(record.get("elapsed_seconds"))
        if elapsed is None and first is not None and _number(record.get("time")):
            elapsed = record["time"] - first
        for metric, value in record.items():
            if metric.startswith("val_") and _number(value) is not None:
                rows.append((record["step"], metric, float(value), elapsed,
                             _number(record.get("device_hours")),
                             _number(record.get("energy_joules"))))
    return rows


def _legacy_id(path: Path, records: list[dict]) -> str:
    """A run from before run.json: named by its folder and its first record, so that a moved
    copy keeps its row."""
    first = json.dumps(records[0], sort_keys=True) if records else ""
    return "dir-" + hashlib.sha1(f"{path.name}\n{first}".encode()).hexdigest()[:24]


def _status(run: RunDir, summary: dict | None, heartbeat: float | None, damage: str | None,
            bad_lines: int) -> tuple[str, str | None]:
    """(status, problem): damaged where summary.json, run.json or a metrics record is
    (`damage`: the first of them, named); else where the run stands, with the metrics lines
    cut short counted."""
    if damage is not None:
        return "damaged", damage
    status = _standing(run, summary, heartbeat)
    return status, f"{bad_lines} line(s) of {METRICS} unreadable (skipped)" if bad_lines \
        else None


def _standing(run: RunDir, summary: dict | None, heartbeat: float | None) -> str:
    if summary is not None:
        state = summary.get("status") if summary.get("status") in FINAL else "failed"
        written = modified(run.summary) or 0
        if heartbeat is not None and heartbeat > written + 5:  # started again since
            return "running"
        return state
    if not (run.config.exists() or run.identity.exists() or run.metrics.exists()):
        return "submitted"  # only the job script: its job has not started yet
    return "running"  # or lost, when its heartbeat is old (read by the index)


def scan_run(path: Path) -> tuple[dict, list[tuple]]:
    """The index row of the run directory `path`, and its evaluations."""
    run = RunDir(path)
    folder_mtime = modified(path)  # before reading: a write meanwhile shows at the next refresh
    identity, identity_damage = read_identity(path)
    identity = identity or {}
    config = run.read_config() or {}
    summary, summary_damage = run.summary_and_damage()
    records, bad_lines, metrics_damage = run.read_metrics()
    heartbeat = max(filter(None, (modified(run.identity), modified(run.metrics))), default=None)
    status, problem = _status(run, summary, heartbeat,
                              summary_damage or identity_damage or metrics_damage, bad_lines)
    summary = summary or {}
    starts = [s for s in identity.get("starts", []) if isinstance(s, dict)]
    last_start = starts[-1] if starts else {}
    progress = next((r for r in reversed(records) if _number(r.get("device_hours"))), {})
    started = _number(identity.get("created")) or next(
        (r["time"] for r in records if _number(r.get("time"))), None) or modified(path)
    best_metric, best_value = next(((name, summary[name]) for name, _ in BEST_METRICS
                                    if _number(summary.get(name)) is not None), (None, None))
    jobs = job_chain(identity) or ([str(summary["slurm_job_id"])]
                                   if summary.get("slurm_job_id") else [])
    row = {
        "run_id": identity.get("run_id") if isinstance(identity.get("run_id"), str)
        else _legacy_id(path, records),
        "path": str(path), "name": path.name,
        "recipe": identity.get("recipe") or _text(config.get("name")) or
        path.name.split("-")[0],
        "status": status, "problem": problem,
        "user_name": identity.get("user"), "host": (last_start.get("hosts") or [None])[0],
        "cluster": identity.get("cluster") or last_start.get("cluster"),
        "started": started,
        "ended": modified(run.summary) if status in FINAL else None,
        "month": time.strftime("%Y-%m", time.localtime(started)) if started else None,
        "config_hash": identity.get("config_hash") or (config_hash(config) if config else None),
        "git_commit": identity.get("git_commit"),
        "jobs": json.dumps(jobs),
        "gpu_model": last_start.get("gpu_model") or (_text(summary.get("device"))
                                                     if summary.get("device") != "cpu" else None),
        "gpu_count": last_start.get("gpus", 0 if summary.get("device") == "cpu" else None),
        "world_size": last_start.get("world_size") or _count(summary.get("world_size")),
        "device_hours": _number(summary.get("device_hours")) or
        _number(progress.get("device_hours")),
        "energy_joules": _number(summary.get("energy_joules")) or
        _number(progress.get("energy_joules")),
        **_goodput(identity),
        "energy_source": _text(summary.get("energy_source")),
        "best_metric": best_metric, "best_value": best_value,
        "steps": _count(summary.get("steps")) if _count(summary.get("steps")) is not None
        else max((r["step"] for r in records if "step" in r), default=None),
        "wall_seconds": _number(summary.get("wall_seconds")) or
        _number(progress.get("elapsed_seconds")),
        "heartbeat": heartbeat,
        "signature": signature(path),
        "folder_mtime": folder_mtime,
        "summary": json.dumps(summary, default=str),
        "config": json.dumps(config, default=str),
    }
    return row, evaluations(records)


def _goodput(identity: dict) -> dict:
    """The run's productive device-hours and goodput from its own records (runs/goodput.py;
    the scheduler's accounting is `hpctrain goodput`'s, not a scan's); None where its jobs
    tell no phases (an older hpctrain)."""
    made = account(identity)
    if not made.allocated or not any(
            isinstance(start, dict) and start.get("split") for start in identity.get("starts", [])):
        return {"productive_hours": None, "goodput": None}
    return {"productive_hours": made.phases["productive"] / 3600, "goodput": made.goodput}


def _listing(folder: Path) -> set[str]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def _folders(parent: Path) -> list[os.DirEntry]:
    try:
        return sorted((e for e in os.scandir(parent) if e.is_dir()), key=lambda e: e.name)
    except OSError:
        return []


def _still(entry: os.DirEntry, settled: dict[str, float]) -> bool:
    """A settled run whose folder has not changed since it was read: a run rewrites run.json
    at every start and summary.json at its end by renaming, which changes the folder."""
    if entry.path not in settled:
        return False
    try:
        return entry.stat().st_mtime == settled[entry.path]
    except OSError:
        return False


def candidate_dirs(root: Path, settled: dict[str, float] | None = None,
                   listed: dict[str, float] | None = None,
                   indexed: dict[str, list[str]] | None = None) \
        -> tuple[list[tuple[str, bool]], dict[str, float]]:
    """(folder, still) for the run directories under an output directory: its folders
    holding a run's files; in a folder with a job script but no configuration (a sweep's
    job), the elements below it (or the folder itself, "submitted", while none has started).
    `settled`: path -> folder time of finished runs; those whose folder is unchanged come back
    `still`, unlisted. `listed`: folder -> its time when a refresh last listed it, and
    `indexed`: folder -> the index's runs in it. On a parallel file system each metadata call
    counts: a folder whose time is unchanged (a run touches the folder holding it whenever it
    replaces run.json or summary.json: directory.mark_changed) holds the runs it held, so it
    is not listed and its settled runs cost nothing; in a folder listed now a settled run
    costs one stat, any other a listing. Also returns the times of the folders listed now."""
    settled, listed, indexed = settled or {}, listed or {}, indexed or {}
    found: list[tuple[str, bool]] = []
    times: dict[str, float] = {}
    root_path, root_time = str(root), _time(str(root))
    if root_time is not None and listed.get(root_path) == root_time:  # the same entries
        found = [(path, path in settled) for path in indexed.get(root_path, [])
                 if path not in listed]
        for folder in [f for f in listed if os.path.dirname(f) == root_path]:
            if (time := _time(folder)) is not None:  # else gone: its runs are marked missing
                found += _sweep_runs(folder, time, settled, listed, indexed, times)
        return found, times
    if root_time is not None:
        times[root_path] = root_time
    for entry in _folders(root):
        if _still(entry, settled):
            found.append((entry.path, True))
            continue
        names = _listing(Path(entry.path))
        if not names & RUN_FILES:
            continue
        if JOB_SCRIPT in names and CONFIG not in names:
            found += _sweep_runs(entry.path, _time(entry.path), settled, listed, indexed, times)
        else:
            found.append((entry.path, False))
    return found, times


def _sweep_runs(folder: str, time: float | None, settled: dict[str, float],
                listed: dict[str, float], indexed: dict[str, list[str]],
                times: dict[str, float]) -> list[tuple[str, bool]]:
    """A sweep's folder: its elements holding run files (the index's, where the folder's
    time is the one it was listed at; else listed now, and its time kept in `times`), or the
    folder itself ("submitted") while none has started."""
    if time is not None and listed.get(folder) == time:
        below = [(path, path in settled) for path in indexed.get(folder, [])]
    else:
        if time is not None:
            times[folder] = time
        below = [(e.path, _still(e, settled)) for e in _folders(Path(folder))]
        below = [(g, still) for g, still in below if still or _listing(Path(g)) & RUN_FILES]
    return below or [(folder, False)]


def _time(folder: str) -> float | None:
    try:
        return os.stat(folder).st_mtime
    except OSError:
        return None
