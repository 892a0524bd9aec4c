"""The run directory: where a run lives, and which checkpoint a resume starts from.

    runs/<name>/config.yaml  metrics.jsonl  summary.json  checkpoints/  tb/

`resume=auto` continues the newest run of this recipe in `output_dir` (or the run named by
`run_name`), so resubmitting the same command after a crash or a time limit just continues;
if there is nothing to continue, it starts fresh.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpctrain.config import Config
from hpctrain.errors import ConfigError
from hpctrain.train.checkpoint import META, list_checkpoints


def _latest_run(output_dir: Path, name: str) -> Path | None:
    """The run of recipe `name` whose newest checkpoint is the most recent."""
    candidates = []
    for run in output_dir.glob(f"{name}-*"):
        checkpoints = list_checkpoints(run / "checkpoints")
        if checkpoints:
            candidates.append((checkpoints[-1].stat().st_mtime, run))
    return max(candidates)[1] if candidates else None


def _new_run_dir(output_dir: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = output_dir / f"{name}-{stamp}"
    suffix = 1
    while run.exists():
        suffix += 1
        run = output_dir / f"{name}-{stamp}-{suffix}"
    return run


def resolve_run(config: Config) -> tuple[Path, Path | None]:
    """(run directory, checkpoint to resume from or None). Nothing is created here: the
    directory appears when the run first reports (Telemetry), so a run that fails to start
    leaves nothing behind."""
    output_dir = Path(config.output_dir).expanduser()
    named = output_dir / config.run_name if config.run_name else None
    resume_from = None
    if config.resume == "auto":
        run = named if named else _latest_run(output_dir, config.name)
        checkpoints = list_checkpoints(run / "checkpoints") if run is not None else []
        resume_from = checkpoints[-1] if checkpoints else None
    elif config.resume:
        target = Path(config.resume).expanduser()
        checkpoints = list_checkpoints(target / "checkpoints")
        if (target / META).is_file():  # one checkpoint folder
            resume_from, run = target, target.parent.parent
        elif checkpoints:
            run, resume_from = target, checkpoints[-1]
        else:
            raise ConfigError(f"resume={config.resume}: no checkpoint there; give a run "
                              "directory with checkpoints/, one checkpoint folder "
                              "(checkpoints/step_N), or resume=auto")
    else:
        run = named
        if run is not None and list_checkpoints(run / "checkpoints"):
            raise ConfigError(f"run_name={config.run_name}: {run} already holds checkpoints; "
                              "continue it with resume=auto, or choose another run_name")
    return run or _new_run_dir(output_dir, config.name), resume_from
