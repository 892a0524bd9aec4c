"""What `hpctrain watch` shows of one run, read from its directory over the shared file system:
the latest figures, sparklines of the loss and the throughput, the ETA, and (for a job) the
Slurm state. Plain reading: the view and the loop are the CLI's."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.runs.directory import RunDir, modified
from hpctrain.runs.identity import read_identity
from hpctrain.runs.live import tail_reading
from hpctrain.runs.lock import held
from hpctrain.runs.scan import FINAL, RESUMABLE

LOST = "ended without a summary"  # no process holds the run, and no summary.json says why
BARS = "▁▂▃▄▅▆▇█"
SPARK_POINTS = 40


def sparkline(values: list[float], width: int = SPARK_POINTS) -> str:
    """The last `width` values as bars, lowest to highest."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)][-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(BARS[min(len(BARS) - 1, int((v - low) / span * len(BARS)))] for v in values)


@dataclass
class Snapshot:
    run_dir: str
    status: str  # running | completed | failed | preempted | hung | interrupted | not
    # started | damaged | LOST
    step: int | None = None
    total_steps: int | None = None
    eta_seconds: float | None = None
    loss: float | None = None
    throughput: float | None = None  # samples/s
    data_wait: float | None = None
    gpu_utilization: float | None = None
    val: dict = field(default_factory=dict)  # the last evaluation's val_* figures
    loss_spark: str = ""
    throughput_spark: str = ""
    slurm_state: str | None = None
    age_seconds: float | None = None  # since the last record
    damage: str | None = None  # a file of the run that could not be read, and why
    held: bool = False  # a living process holds the run (its lock)

    @property
    def ended(self) -> bool:
        """Finished (not to be continued), or left by every process without a summary that
        says so (killed, lost, its summary damaged)."""
        if self.status in FINAL:
            return self.status not in RESUMABLE
        return not self.held and self.status in ("running", "damaged", LOST)


def _total_steps(config: dict, train: dict) -> int | None:
    """From config.yaml: train.max_steps, else epochs x the steps per epoch the records show."""
    settings = config.get("train") if isinstance(config.get("train"), dict) else {}
    if isinstance(settings.get("max_steps"), int):
        return settings["max_steps"]
    epoch, step = train.get("epoch"), train.get("step")
    epochs = settings.get("epochs")
    if isinstance(epochs, (int, float)) and math.isfinite(epochs) and epoch and step and \
            math.isfinite(total := epochs * step / epoch):
        return round(total)
    return None


def snapshot(run_dir: Path) -> Snapshot:
    run = RunDir(run_dir)
    records, damage = tail_reading(run.metrics)  # once: the curves and the latest of each kind
    trains = [r for r in records if r.get("kind") == "train" and "step" in r and "time" in r]
    latest = {r["kind"]: r for r in records}
    summary, summary_damage = run.summary_and_damage()
    summary = summary or {}
    status = summary.get("status", "running" if trains else "not started")
    if summary and trains and trains[-1].get("time", 0) > (modified(run.summary) or 0.0):
        status = "running"  # started again after its last summary (a requeue)
    shot = Snapshot(str(run_dir), status if isinstance(status, str) and not summary_damage
                    else "damaged", damage=summary_damage or read_identity(run_dir)[1] or damage,
                    held=held(run_dir))
    if shot.status == "running" and not shot.held:
        shot.status = LOST  # no process holds it, and no summary says how it ended
    if not trains:
        return shot
    last = trains[-1]
    shot.step, shot.loss = last.get("step"), last.get("loss")
    shot.throughput = last.get("samples_per_second")
    shot.data_wait = last.get("data_wait_fraction")
    shot.gpu_utilization = (latest.get("gpu") or {}).get("utilization_mean")
    shot.val = {k: v for k, v in (latest.get("eval") or {}).items() if k.startswith("val_")}
    shot.loss_spark = sparkline([r.get("loss") for r in trains])
    shot.throughput_spark = sparkline([r.get("samples_per_second") for r in trains])
    shot.total_steps = _total_steps(run.read_config() or {}, last)
    shot.age_seconds = time.time() - last["time"] if "time" in last else None
    if shot.total_steps and len(trains) > 1 and not shot.ended:
        first = trains[max(0, len(trains) - 10)]  # the recent rate
        rate = (last["step"] - first["step"]) / max(last["time"] - first["time"], 1e-9)
        if rate > 0:
            shot.eta_seconds = max(0.0, (shot.total_steps - last["step"]) / rate)
    return shot

