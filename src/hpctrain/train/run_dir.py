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
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.config import Config
from hpctrain.errors import ConfigError, DataError
from hpctrain.runs.directory import SET_ASIDE, SET_ASIDE_REASONS, RunDir, is_checkpoint
from hpctrain.train.checkpoint import step_of
from hpctrain.train.safe_checkpoint import DamagedCheckpoint, problem
from hpctrain.train.telemetry import drop_records_after

STAMP = r"\d{8}-\d{6}(?:-\d+)?"  # what _new_run_dir appends to the recipe name


@dataclass
class RunPlace:
    """Where a run lives, the checkpoint it resumes from, and the checkpoints that must leave
    its history first (with why) once that resume has succeeded."""

    run_dir: Path
    resume_from: Path | None = None
    set_aside: list[tuple[Path, str]] = field(default_factory=list)


def _latest_run(output_dir: Path, name: str) -> Path | None:
    """The run of recipe `name` (exactly: not `name-v2`) whose newest checkpoint is the most
    recent."""
    own = re.compile(rf"^{re.escape(name)}-{STAMP}$")
    candidates = []
    for run in output_dir.glob(f"{name}-*"):
        if not own.match(run.name) or _recipe_of(run) not in (None, name):
            continue
        checkpoints = RunDir(run).list_checkpoints()
        if checkpoints:
            candidates.append((checkpoints[-1].stat().st_mtime, run))
    return max(candidates)[1] if candidates else None


def _recipe_of(run: Path) -> str | None:
    """The recipe name a run's config.yaml records (None when it cannot be read)."""
    return (RunDir(run).read_config() or {}).get("name")


def _new_run_dir(output_dir: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = output_dir / f"{name}-{stamp}"
    suffix = 1
    while run.exists():
        suffix += 1
        run = output_dir / f"{name}-{stamp}-{suffix}"
    return run


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


def _newest_whole(run: Path, checkpoints: list[Path]) -> RunPlace:
    """Resume from the newest checkpoint that passes the check; newer damaged ones are set
    aside, named."""
    damaged = []
    for checkpoint in reversed(checkpoints):
        reason = problem(checkpoint)
        if reason is None:
            return RunPlace(run, checkpoint, [(c, f"damaged: {why}") for c, why in damaged])
        damaged.append((checkpoint, reason))
    raise DamagedCheckpoint(
        f"every checkpoint of {run} is damaged:\n  " + "\n  ".join(why for _, why in damaged)
        + f"\nMove {RunDir(run).checkpoints} away to start afresh, or resume from a copy of the run "
        "that is whole")


def _branch_from(checkpoint: Path) -> RunPlace:
    """Resume from the checkpoint folder given: newer checkpoints of its run leave its
    history."""
    reason = problem(checkpoint)
    if reason is not None:
        raise DamagedCheckpoint(f"resume={checkpoint}: {reason}. Resume from another "
                                "checkpoint, or from the run directory (the newest whole "
                                "checkpoint is taken)")
    later = [c for c in RunDir(checkpoint.parent.parent).list_checkpoints() if step_of(c) > step_of(checkpoint)]
    return RunPlace(checkpoint.parent.parent, checkpoint,
                    [(c, f"after {checkpoint.name}, the checkpoint resumed from: another "
                      "branch of the run") for c in later])


def resolve_run(config: Config) -> RunPlace:
    """Where this run lives and what it resumes from. Only output_dir is created here: the run
    directory appears when the run first reports (Telemetry), so a run that fails to start
    leaves nothing behind."""
    output_dir = writable_output_dir(config.output_dir)
    named = output_dir / config.run_name if config.run_name else None
    if config.resume == "auto":
        run = named if named else _latest_run(output_dir, config.name)
        checkpoints = RunDir(run).list_checkpoints() if run is not None else []
        if checkpoints:
            return _newest_whole(run, checkpoints)
        return RunPlace(run or _new_run_dir(output_dir, config.name))
    if config.resume:
        target = Path(config.resume).expanduser()
        if is_checkpoint(target):
            return _branch_from(target)
        checkpoints = RunDir(target).list_checkpoints()
        if not checkpoints:
            raise ConfigError(f"resume={config.resume}: no checkpoint there; give a run "
                              "directory with checkpoints/, one checkpoint folder "
                              "(checkpoints/step_N), or resume=auto")
        return _newest_whole(target, checkpoints)
    if named is not None and RunDir(named).list_checkpoints():
        raise ConfigError(f"run_name={config.run_name}: {named} already holds checkpoints; "
                          "continue it with resume=auto, or choose another run_name")
    return RunPlace(named or _new_run_dir(output_dir, config.name))


def set_aside(place: RunPlace) -> str | None:
    """Move `place.set_aside` out of the run's history (after the resume succeeded), with the
    metrics logged after the resumed step; lines saying what moved, and where (None: nothing)."""
    if not place.set_aside:
        return None
    run = RunDir(place.run_dir)
    folder = run.checkpoints / SET_ASIDE.format(time=time.strftime('%Y%m%d-%H%M%S'))
    folder.mkdir(parents=True, exist_ok=True)
    for checkpoint, _ in place.set_aside:
        os.replace(checkpoint, folder / checkpoint.name)
    (folder / SET_ASIDE_REASONS).write_text(json.dumps(
        {c.name: why for c, why in place.set_aside}, indent=1) + "\n")
    later = drop_records_after(run.metrics, step_of(place.resume_from))
    if later:
        (folder / run.metrics.name).write_text("".join(later))
    lines = [f"  {'warning: ' if why.startswith('damaged') else ''}set aside {c.name}: {why}"
             for c, why in place.set_aside]
    return "\n".join([*lines, f"  (moved to {folder}, with {SET_ASIDE_REASONS})"])
