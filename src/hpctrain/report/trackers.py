"""The trackers a run's telemetry also goes to (`tracking.sinks`): TensorBoard, MLflow,
Weights & Biases. One stream: every metrics.jsonl record is handed to each sink as
`kind/key` scalars at its step; at the end the summary (final metrics), and the report and
the profile (artifacts). Only rank 0 has sinks.

MLflow and W&B are extras, imported only when chosen (`check` names the pip command before
anything is built). Both work without a network: MLflow writes a file store beside the run
directories by default (one folder per run: no lock on a parallel file system; its
maintenance mode is opted into for that store only, and `mlflow migrate-filestore` converts
it), W&B runs offline by default (`hpctrain runs sync RUN` or `wandb sync` from a login node
later). A requeued run continues the same tracker run: MLflow's run id is kept in run.json,
W&B's id is the run's own id.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from pathlib import Path

from hpctrain.config import Config, flatten
from hpctrain.errors import ConfigError
from hpctrain.runs.directory import RunDir
from hpctrain.runs.identity import remember_tracker
from hpctrain.writers import own_folder

EXTRAS = {"mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}  # sink: module, extra
MLFLOW_STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED",
                 "preempted": "KILLED", "hung": "KILLED", "pruned": "KILLED"}


def check(config: Config) -> None:
    """A ConfigError naming the pip command for a chosen sink whose library is missing."""
    for sink in config.tracking.sinks:
        if sink in EXTRAS and not _installed(EXTRAS[sink][0]):
            raise ConfigError(f"tracking.sinks: {sink} is not installed; pip install "
                              f"'hpctrain[{EXTRAS[sink][1]}]', or leave {sink} out of "
                              "tracking.sinks")


def mlflow_uri(configured: str | None, run_dir: Path) -> str:
    """The run's MLflow tracking URI: the configured one, else the file store beside the run
    directories (MLflow 3 keeps file stores in maintenance mode: opted into for this one)."""
    if configured:
        return configured
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (run_dir.parent / "mlruns").as_uri()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules as None: import refused
        return False


def _scalars(kind: str, values: dict) -> dict[str, float]:
    return {f"{kind}/{key}": float(value) for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


class TensorBoard:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(own_folder(RunDir(run_dir).tensorboard)))

    def record(self, kind: str, step: int, when: float, values: dict) -> None:
        for key, value in _scalars(kind, values).items():
            self.writer.add_scalar(key, value, step)

    def finish(self, summary: dict, files: list[Path]) -> None:
        self.writer.close()


class Mlflow:
    def __init__(self, run_dir: Path, config: Config, identity: dict):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=mlflow_uri(config.tracking.mlflow_uri,
                                                           run_dir))
        known = (identity.get("trackers") or {}).get("mlflow")
        if known:  # a requeued or resumed run: the same MLflow run
            self.run_id = known
            self.client.update_run(known, status="RUNNING")
            return
        name = config.tracking.experiment or config.name
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment, run_name=run_dir.name, tags={
            "hpctrain.run_dir": str(run_dir), "hpctrain.run_id": identity.get("run_id", ""),
            "mlflow.user": identity.get("user", "")}).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in
                  flatten(config.model_dump(mode="json")).items()]
        for first in range(0, len(params), 100):  # MLflow takes 100 per batch
            self.client.log_batch(self.run_id, params=params[first:first + 100])
        remember_tracker(run_dir, "mlflow", self.run_id)

    def record(self, kind: str, step: int, when: float, values: dict) -> None:
        from mlflow.entities import Metric

        self.client.log_batch(self.run_id, metrics=[
            Metric(key, value, int(when * 1000), step)
            for key, value in _scalars(kind, values).items()])

    def finish(self, summary: dict, files: list[Path]) -> None:
        from mlflow.entities import Metric

        step, now = summary.get("steps") or 0, int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[
            Metric(key, value, now, step) for key, value in _scalars("summary", {
                k: v for k, v in summary.items() if not isinstance(v, (dict, list))}).items()])
        for path in files:
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), path.name)
            elif path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_tag(self.run_id, "hpctrain.status", summary.get("status", "failed"))
        self.client.set_terminated(self.run_id, MLFLOW_STATUS.get(summary.get("status"),
                                                                  "FAILED"))


class Wandb:
    def __init__(self, run_dir: Path, config: Config, identity: dict):
        import wandb

        self.run_dir = run_dir
        self.run = wandb.init(
            project=config.tracking.experiment or config.name, dir=str(run_dir),
            mode=config.tracking.wandb_mode, id=identity["run_id"], resume="allow",
            name=run_dir.name, config=config.model_dump(mode="json"),
            settings=wandb.Settings(console="off", silent=True))

    def record(self, kind: str, step: int, when: float, values: dict) -> None:
        scalars = _scalars(kind, values)
        if scalars and step >= self.run.step:  # W&B keeps steps increasing: a resumed
            self.run.log(scalars, step=step)   # run's repeated steps are not logged again

    def finish(self, summary: dict, files: list[Path]) -> None:
        self.run.summary.update({k: v for k, v in summary.items()
                                 if isinstance(v, (int, float, str)) or v is None})
        for path in files:
            if path.is_file():
                self.run.save(str(path), base_path=str(self.run_dir), policy="now")
        self.run.finish(exit_code=0 if summary.get("status") == "completed" else 1)


def open_sinks(config: Config, run_dir: Path, identity: dict) -> list:
    """The chosen sinks, opened for this start of the run (rank 0 only). One that cannot be
    opened (a tracking server unreachable) is said, and the run trains without it."""
    kinds = {"tensorboard": lambda: TensorBoard(run_dir),
             "mlflow": lambda: Mlflow(run_dir, config, identity),
             "wandb": lambda: Wandb(run_dir, config, identity)}
    sinks = []
    for name in config.tracking.sinks:
        try:
            sinks.append(kinds[name]())
        except Exception as err:
            print(f"hpctrain: warning: tracking.sinks: {name} could not start "
                  f"({type(err).__name__}: {str(err)[:300]}); training goes on without it, "
                  "metrics.jsonl has every figure", file=sys.stderr, flush=True)
    return sinks
