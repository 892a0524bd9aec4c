"""The run directory: where a run lives, and which checkpoint a resume starts from.

    runs/<name>/  (its files: runs/directory.py)

`resume=auto` continues the newest run of this recipe in `output_dir` (or the run named by
`run_name`), so resubmitting the same command after a crash or a time limit just continues;
if there is nothing to continue, it starts fresh.

A resume starts from the newest checkpoint whose files are whole (safe_checkpoint.problem);
newer ones that are damaged are named and set aside. Resuming from an older checkpoint while
newer ones exist starts a branch: the newer checkpoints, and the metrics logged after the
branch point, are moved to `checkpoints/set-aside-<time>/` so that retention, `resume=auto`
and metrics.jsonl only ever see one line of history.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.config import Config
from hpctrain.errors import ConfigError, DataError
from hpctrain.runs.directory import (SET_ASIDE, SET_ASIDE_REASONS, RunDir, is_checkpoint, is_run_of,
                                     new_run_name, run_of_checkpoint, stamp)
from hpctrain.runs.lock import RunLock, claim, claim_new
from hpctrain.train.checkpoints.checkpoint import step_of
from hpctrain.train.checkpoints.safe_checkpoint import DamagedCheckpoint, problem
from hpctrain.train.telemetry import drop_records_after
from hpctrain.writers import own_folder, write_whole

@dataclass
class RunPlace:
    """Where a run lives (its directory, locked for it), the checkpoint it resumes from, and
    the checkpoints that must leave its history first (with why) once that resume has
    succeeded."""

    lock: RunLock
    resume_from: Path | None = None
    set_aside: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.lock.run_dir


def _latest_run(output_dir: Path, name: str) -> Path | None:
    """The run of recipe `name` (exactly: not `name-v2`) whose newest checkpoint is the most
    recent."""
    candidates = []
    for run in output_dir.glob(f"{name}-*"):
        if not is_run_of(run.name, name) or _recipe_of(run) not in (None, name):
            continue
        checkpoints = RunDir(run).list_checkpoints()
        if checkpoints:
            candidates.append((checkpoints[-1].stat().st_mtime, run))
    return max(candidates)[1] if candidates else None


def _recipe_of(run: Path) -> str | None:
    """The recipe name a run's config.yaml records (None when it cannot be read)."""
    return (RunDir(run).read_config() or {}).get("name")


def writable_output_dir(setting: str) -> Path:
    """`output_dir`, or a DataError saying why no run could be written there: a file in its
    place, or a folder (it or the nearest existing parent, which a run would create it in)
    that refuses a file. Nothing is left behind by the check."""
    output_dir = Path(setting).expanduser().absolute()
    existing = output_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise DataError(f"output_dir={setting}: {existing} is a file, not a folder; choose "
                        "another output_dir")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise DataError(f"output_dir={setting}: cannot write in {existing} "
                        f"({err.strerror or err}); choose a writable output_dir") from None
    return output_dir


def _newest_whole(lock: RunLock) -> RunPlace:
    """Resume from the newest checkpoint of the locked run that passes the check; newer
    damaged ones are set aside, named."""
    run, damaged = lock.run_dir, []
    for checkpoint in reversed(RunDir(run).list_checkpoints()):
        reason = problem(checkpoint)
        if reason is None:
            return RunPlace(lock, checkpoint, [(c, f"damaged: {why}") for c, why in damaged])
        damaged.append((checkpoint, reason))
    raise DamagedCheckpoint(
        f"every checkpoint of {run} is damaged:\n  " + "\n  ".join(why for _, why in damaged)
        + f"\nMove {RunDir(run).checkpoints} away to start afresh, or resume from a copy of "
        "the run that is whole")


def _branch_from(checkpoint: Path, lock: RunLock) -> RunPlace:
    """Resume from the checkpoint folder given: newer checkpoints of its (locked) run leave
    its history."""
    reason = problem(checkpoint)
    if reason is not None:
        raise DamagedCheckpoint(f"resume={checkpoint}: {reason}. Resume from another "
                                "checkpoint, or from the run directory (the newest whole "
                                "checkpoint is taken)")
    later = [c for c in RunDir(lock.run_dir).list_checkpoints()
             if step_of(c) > step_of(checkpoint)]
    return RunPlace(lock, checkpoint,
                    [(c, f"after {checkpoint.name}, the checkpoint resumed from: another "
                      "branch of the run") for c in later])


def resolve_run(config: Config, job_id: str | None = None, restart: int = 0) -> RunPlace:
    """Where this run lives and what it resumes from, with the run directory locked for this
    run (runs/lock.py: RunInUse when a living run holds it). The claim makes the folders it
    needs, and `place.lock.release()` removes those the run left empty, so a run that fails to
    start leaves nothing behind. `job_id`, `restart`: this process's Slurm job and start."""
    output_dir = writable_output_dir(config.output_dir)
    named = output_dir / config.run_name if config.run_name else None
    if config.resume == "auto":
        run = named if named else _latest_run(output_dir, config.name)
        if run is None:
            return RunPlace(_new_run(output_dir, config.name, job_id, restart))
        return _locked(claim(run, job_id, restart, _setting(config)), _resume_in)
    if config.resume:
        target = Path(config.resume).expanduser()
        run = run_of_checkpoint(target) if is_checkpoint(target) else target
        if not is_checkpoint(target) and not RunDir(target).list_checkpoints():
            raise ConfigError(f"resume={config.resume}: no checkpoint there; give a run "
                              "directory with checkpoints/, one checkpoint folder "
                              "(checkpoints/step_N), or resume=auto")
        return _locked(claim(run, job_id, restart, f"resume={config.resume}"),
                       lambda lock: _branch_from(target, lock) if is_checkpoint(target)
                       else _newest_whole(lock))
    if named is None:
        return RunPlace(_new_run(output_dir, config.name, job_id, restart))
    return _locked(claim(named, job_id, restart, _setting(config)), _fresh_named(config))


def _setting(config: Config) -> str:
    return f"run_name={config.run_name}" if config.run_name else "resume=auto"


def _new_run(output_dir: Path, name: str, job_id: str | None, restart: int):
    return claim_new(output_dir, new_run_name(name), job_id, restart)


def _locked(lock: RunLock, place: Callable[[RunLock], RunPlace]) -> RunPlace:
    """`place(lock)`, the lock released when it fails."""
    try:
        return place(lock)
    except BaseException:
        lock.release()
        raise


def _resume_in(lock: RunLock) -> RunPlace:
    """resume=auto in a locked run directory: its newest whole checkpoint, or a fresh start
    when it has none."""
    return _newest_whole(lock) if RunDir(lock.run_dir).list_checkpoints() else RunPlace(lock)


def _fresh_named(config: Config) -> Callable[[RunLock], RunPlace]:
    def place(lock: RunLock) -> RunPlace:
        if RunDir(lock.run_dir).list_checkpoints():
            raise ConfigError(f"run_name={config.run_name}: {lock.run_dir} already holds "
                              "checkpoints; continue it with resume=auto, or choose another "
                              "run_name")
        return RunPlace(lock)
    return place


def set_aside(place: RunPlace) -> str | None:
    """Move `place.set_aside` out of the run's history (after the resume succeeded), with the
    metrics logged after the resumed step; lines saying what moved, and where (None: nothing)."""
    if not place.set_aside:
        return None
    run = RunDir(place.run_dir)
    folder = own_folder(run.checkpoints / SET_ASIDE.format(time=stamp()))
    for checkpoint, _ in place.set_aside:
        os.replace(checkpoint, folder / checkpoint.name)
    write_whole(folder / SET_ASIDE_REASONS, json.dumps(
        {c.name: why for c, why in place.set_aside}, indent=1) + "\n")
    later = drop_records_after(run.metrics, step_of(place.resume_from))
    if later:
        write_whole(folder / run.metrics.name, "".join(later))
    lines = [f"  {'warning: ' if why.startswith('damaged') else ''}set aside {c.name}: {why}"
             for c, why in place.set_aside]
    return "\n".join([*lines, f"  (moved to {folder}, with {SET_ASIDE_REASONS})"])
