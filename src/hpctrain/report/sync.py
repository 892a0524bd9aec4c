"""`hpctrain runs sync RUN`: from a login node, send what a run's trackers kept offline on the
compute nodes to where the group looks: its W&B offline runs through `wandb sync`, its MLflow
run (in the file store beside the run directories) copied to a tracking server (`--mlflow-uri`):
parameters, every metric's history, tags, artifacts and status. A run copied once to a server
is not copied again (run.json remembers the copy).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hpctrain.commands import run_shown
from hpctrain.errors import ConfigError
from hpctrain.runs.identity import read_identity, remember_tracker

BATCH = 1000  # MLflow's most metrics per log_batch
SYNC_SECONDS = 2 * 3600.0  # a run's offline W&B runs sent: far more than their media take


def wandb_offline_runs(run_dir: Path) -> list[Path]:
    """The run's W&B offline runs (one per start of the run, all with the run's id)."""
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def sync_wandb(run_dir: Path, dry_run: bool) -> list[str]:
    """`wandb sync` of the run's offline runs; the command (run unless `dry_run`)."""
    found = wandb_offline_runs(run_dir)
    if not found:
        return []
    command = [sys.executable, "-m", "wandb", "sync", *map(str, found)]
    if not dry_run:
        try:
            code = run_shown(command, SYNC_SECONDS)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"wandb sync of {run_dir} took more than {SYNC_SECONDS / 3600:g} h "
                              "and was stopped; run it again (runs synced are not sent twice) "
                              "and check the login node's network") from None
        if code != 0:
            raise ConfigError(f"wandb sync failed (exit {code}) for {run_dir}; "
                              "check the login node's network and `wandb login`")
    return command


def copy_mlflow(run_dir: Path, source_uri: str, target_uri: str) -> str:
    """Copy the run's MLflow run to `target_uri`; the run id there."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    identity, damage = read_identity(run_dir)
    if damage is not None:
        raise ConfigError(f"{run_dir}: {damage}; its tracker runs cannot be found")
    trackers = (identity or {}).get("trackers") or {}
    run_id = trackers.get("mlflow")
    if not run_id:
        raise ConfigError(f"{run_dir}: no MLflow run (the run did not have mlflow in "
                          "tracking.sinks)")
    copies = trackers.get("mlflow_copies") or {}
    if target_uri in copies:
        return copies[target_uri]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    source, target = MlflowClient(tracking_uri=source_uri), MlflowClient(tracking_uri=target_uri)
    run = source.get_run(run_id)
    name = source.get_experiment(run.info.experiment_id).name
    found = target.get_experiment_by_name(name)
    experiment = found.experiment_id if found else target.create_experiment(name)
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    copy = target.create_run(experiment, start_time=run.info.start_time,
                             run_name=run.info.run_name,
                             tags={**tags, "hpctrain.copied_from": f"{source_uri}#{run_id}"})
    copy_id = copy.info.run_id
    params = [Param(k, v) for k, v in run.data.params.items()]
    for first in range(0, len(params), 100):
        target.log_batch(copy_id, params=params[first:first + 100])
    for key in run.data.metrics:
        history = [Metric(m.key, m.value, m.timestamp, m.step)
                   for m in source.get_metric_history(run_id, key)]
        for first in range(0, len(history), BATCH):
            target.log_batch(copy_id, metrics=history[first:first + BATCH])
    with tempfile.TemporaryDirectory() as folder:
        if source.list_artifacts(run_id):
            local = source.download_artifacts(run_id, "", folder)
            target.log_artifacts(copy_id, local)
    target.set_terminated(copy_id, run.info.status, end_time=run.info.end_time)
    remember_tracker(run_dir, "mlflow_copies", {**copies, target_uri: copy_id})
    return copy_id
