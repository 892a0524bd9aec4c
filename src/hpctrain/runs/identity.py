"""run.json: who ran a run, where, from which code and configuration, and in which jobs.

Written by rank 0 at every start (the first start creates it; each later start, a resume or
a requeue, appends itself to `starts`), so that a run directory names itself: the runs index
keys a run by its `run_id` (found again, not duplicated, when the folder moves), and reads the
Slurm job chain, the GPUs and the code from here. The file's modification time is the run's
heartbeat (Heartbeat touches it), so a run killed without a word shows as lost.

Each start also keeps its job's own figures (`seconds`, `device_hours`, `energy_joules`),
written at every checkpoint and when the job ends: the run's time, device-hours, energy and
restarts are the sum over its starts, so a job that saved nothing (stopped during start-up,
before its first step) counts as much as one that did.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

from hpctrain.commands import run_command
from hpctrain.readers import (AMOUNT, COUNT, MAPPING, SECONDS, TEXT, TIME, Kind, field_problem,
                              json_document, list_of, optional)
from hpctrain.runs.directory import CAPS, IDENTITY, RunDir, mark_changed, stamp
from hpctrain.writers import write_whole

# what says where a run lives, not what it trains: not part of the configuration's hash
LOCATION_KEYS = ("output_dir", "run_name", "resume", "compile_cache")
HEARTBEAT_SECONDS = 60.0
DAMAGED = IDENTITY + ".damaged-{time}"  # a damaged run.json, kept aside when a start replaces it
# what run.json must hold to be read (record_start writes it), and each of its starts
RECORD_RULES = {
    "run_id": TEXT, "name": TEXT, "recipe": optional(TEXT), "created": TIME,
    "user": optional(TEXT), "cluster": optional(TEXT), "git_commit": optional(TEXT),
    "config_hash": optional(TEXT), "starts": list_of(MAPPING), "trackers": MAPPING,
}
START_RULES = {
    "time": TIME, "job_id": optional(TEXT), "restart": COUNT, "launcher": TEXT,
    "world_size": COUNT, "hosts": list_of(TEXT), "gpu_model": optional(TEXT),
    "gpus": optional(COUNT), "output_dir": TEXT, "seconds": optional(SECONDS),
    "device_hours": optional(AMOUNT), "energy_joules": optional(AMOUNT),
    "claimed": optional(TIME), "began": optional(TIME), "lost": optional(TEXT),
    "redone_steps": optional(COUNT),
    "redone_seconds": optional(SECONDS), "hung": optional(TEXT),
    "split": optional(Kind("a mapping of the job's seconds by phase, each at most a year",
                           lambda v: isinstance(v, dict) and
                           all(optional(SECONDS).holds(x) for x in v.values()))),
}


def read_identity(run_dir: Path) -> tuple[dict | None, str | None]:
    """run.json's record, checked field by field: (record, None); (None, why) when it is there
    but damaged (cut short, or a field breaking RECORD_RULES); (None, None) when absent."""
    record, unreadable = json_document(RunDir(run_dir).identity, CAPS[IDENTITY])
    if unreadable is not None or (record is not None and not isinstance(record, dict)):
        return None, f"{IDENTITY} {unreadable or 'is not a JSON object'}"
    if record is None:
        return None, None
    why = field_problem(record, RECORD_RULES, ("run_id", "starts"))
    for number, start in enumerate(record.get("starts") if why is None else []):
        if (problem := field_problem(start, START_RULES)) is not None:
            why = f"starts[{number}].{problem}"
            break
    return (None, f"{IDENTITY}: {why}") if why else (record, None)


def config_hash(config: dict) -> str:
    """The same for two runs that train the same thing, wherever they live."""
    kept = {k: v for k, v in config.items() if k not in LOCATION_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def git_commit(folder: Path) -> str | None:
    """The commit checked out where the run was started (with '+dirty' for local changes)."""
    try:
        head = run_command(["git", "rev-parse", "HEAD"], 5, cwd=folder)
        if head.returncode != 0:
            return None
        dirty = run_command(["git", "status", "--porcelain", "--untracked-files=no"], 5,
                            cwd=folder)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def record_start(run_dir: Path, config: dict, start: dict, lost: dict | None = None,
                 redone_seconds: float | None = None) -> dict:
    """Create or extend run.json with this start (`start`: time, claimed, job_id, hosts,
    world_size, gpu_model, gpus, launcher); the whole record. Written atomically. `lost`: the
    start whose lock this one took over (claimed, job_id, restart, host, last_beat), which
    died without a word: added when it never reported, given its seconds when it had none.
    `redone_seconds`: what the start's `redone_steps` took the job before, from its records.
    """
    run = RunDir(run_dir)
    record, damage = read_identity(run_dir)
    if damage is not None:  # kept, not overwritten: the new record starts afresh
        os.replace(run.identity, run_dir / DAMAGED.format(time=stamp()))
    if record is None:
        record = {"run_id": uuid.uuid4().hex, "name": run_dir.name,
                  "recipe": config.get("name"), "created": time.time(),
                  "user": _user(), "cluster": start.pop("cluster", None),
                  "git_commit": git_commit(Path.cwd()), "starts": []}
    start.pop("cluster", None)
    record["config_hash"] = config_hash(config)
    record["starts"] = [*record.get("starts", [])]
    if lost is not None:
        _account_for(record["starts"], lost)
    if start.get("redone_steps") and record["starts"]:
        _add_redone(record["starts"][-1], start["redone_steps"], redone_seconds)
    record["starts"].append(start)
    _write(run, record)
    return record


def _add_redone(before: dict, steps: int, seconds: float | None) -> None:
    """The steps the job before trained after its last checkpoint, which this start does
    again (`redone_seconds`). A job killed after it reported at its last checkpoint held its
    devices that much longer than its seconds say: they are added to them, so the run's time
    and device-hours count them; one whose seconds already run to its end (it hung, or they
    were counted to its last beat: `lost`) keeps them. `seconds`: what they took, from that
    job's own records; None (records of an older hpctrain): its mean step time."""
    split = before.get("split") if isinstance(before.get("split"), dict) else {}
    trained, training = split.get("steps"), split.get("training")
    if _number(before.get("seconds")) is None:
        return
    if seconds is None:
        if not (COUNT.holds(trained) and trained and AMOUNT.holds(training)):
            return  # a job of an older hpctrain: its step time is not known
        seconds = steps * training / trained
    before["redone_seconds"] = seconds
    if before.get("hung") or before.get("lost"):
        return
    before["seconds"] += seconds
    if _number(before.get("device_hours")) is not None and COUNT.holds(before.get("world_size")):
        before["device_hours"] += seconds * before["world_size"] / 3600


def record_job(run_dir: Path, number: int, seconds: float, device_hours: float,
               energy_joules: float | None, split: dict | None = None,
               keep_energy: bool = False) -> None:
    """This job's figures so far into its start (`number`: its place in `starts`); `split`:
    its seconds by phase (bookkeeping.Clock.split), what `hpctrain goodput` reads;
    `keep_energy`: the energy recorded before stands (its meter has stopped)."""
    run = RunDir(run_dir)
    record, _ = read_identity(run_dir)
    starts = record["starts"] if record is not None else []
    if not 0 <= number < len(starts):
        return  # run.json damaged or replaced meanwhile: the summary still tells this job
    starts[number].update(seconds=seconds, device_hours=device_hours)
    if not keep_energy:
        starts[number]["energy_joules"] = energy_joules
    if split is not None:
        starts[number]["split"] = split
    _write(run, record)


def mark_hung(run_dir: Path, number: int, line: str) -> int:
    """The hang that ends this job (`number`: its place in `starts`), its line kept in its
    start; how many of the run's jobs hung, this one included."""
    record, _ = read_identity(run_dir)
    starts = record["starts"] if record is not None else []
    if not 0 <= number < len(starts):
        return 1
    starts[number]["hung"] = line
    _write(RunDir(run_dir), record)
    return sum(1 for start in starts if isinstance(start, dict) and start.get("hung"))


def _account_for(starts: list, lost: dict) -> None:
    """The start that died without a word (kill -9, a lost node) and left its lock behind:
    it lived from its process's start (`began`; its claim of the run for a lock of an older
    hpctrain) at least until its last beat (its lock's, every second, or rank 0's
    progress.json). One that never reported (killed during start-up) is added; one that
    reported fewer seconds (its last checkpoint's, and the steps after it) gets those."""
    lived = max(0.0, lost["last_beat"] - (lost.get("began") or lost["claimed"]))
    own = next((s for s in starts if isinstance(s, dict) and
                s.get("claimed") == lost["claimed"]), None)
    said = "died without a word; seconds: at least, to its lock's last heartbeat"
    if own is None:
        starts.append({"time": lost["claimed"], "claimed": lost["claimed"],
                       "began": lost.get("began"),
                       "job_id": lost["job_id"], "restart": lost["restart"],
                       "hosts": [lost["host"]], "seconds": lived,
                       "lost": "during start-up, before it reported: " + said})
    elif _number(own.get("seconds")) is None or own["seconds"] < lived:
        own.update(seconds=lived, lost=said, device_hours=lived * own["world_size"] / 3600
                   if COUNT.holds(own.get("world_size")) else None)


def earlier_jobs(record: dict, number: int) -> dict:
    """The figures of the starts before `number`: `restarts`, every one of them; summed when
    each has them (else the checkpoint's are the best known: starts of an hpctrain before
    these figures), `wall_seconds`, `device_hours`, `energy_joules` (None where none was
    measured)."""
    starts = record.get("starts", [])[:number]
    figures = [s for s in starts if isinstance(s, dict) and _number(s.get("seconds")) is not None
               and _number(s.get("device_hours")) is not None]
    if len(figures) != len(starts):
        return {"restarts": len(starts)}
    energies = [s["energy_joules"] for s in figures if _number(s.get("energy_joules")) is not None]
    return {"wall_seconds": sum(s["seconds"] for s in figures),
            "device_hours": sum(s["device_hours"] for s in figures),
            "energy_joules": sum(energies) if energies else None, "restarts": len(starts)}


def _number(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def remember_tracker(run_dir: Path, tracker: str, run_id: str | dict) -> None:
    """Keep a tracker's run id in run.json, so that the next start continues that run (and
    `runs sync` knows what it copied where)."""
    run = RunDir(run_dir)
    record, _ = read_identity(run_dir)
    if record is None:
        return  # written at the start, before trackers open: damaged since, nothing to extend
    record.setdefault("trackers", {})[tracker] = run_id
    _write(run, record)


def _write(run: RunDir, record: dict) -> None:
    """run.json replaced at once (the rename marks the run's folder as changed, and the folder
    holding it is touched: runs/index)."""
    write_whole(run.identity, json.dumps(record, indent=1) + "\n")
    mark_changed(run.path)


def job_chain(record: dict) -> list[str]:
    """The Slurm jobs the run ran in, in order, each once."""
    chain = []
    for start in record.get("starts", []):
        job = start.get("job_id") if isinstance(start, dict) else None
        if job and job not in chain:
            chain.append(str(job))
    return chain


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


class Heartbeat:
    """Touches `path` (a run's run.json, a search's claim on a trial) every `every` seconds
    on a thread of its own while its owner lives, and beats the run's row in a shared index
    when it has one (live_registration.py)."""

    def __init__(self, path: Path, registration=None, every: float = HEARTBEAT_SECONDS):
        self.path, self.registration, self.every = path, registration, every
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hpctrain-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping.wait(self.every):
            try:
                os.utime(self.path, follow_symlinks=False)
            except OSError:  # a full or vanished file system: the run says so elsewhere
                pass
            if self.registration is not None:
                self.registration.beat()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)

    def close(self) -> None:
        """After the summary: the shared index's row from the finished run directory."""
        if self.registration is not None:
            self.registration.finish()
