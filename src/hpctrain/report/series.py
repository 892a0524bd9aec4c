"""What a report plots, read from a run directory: every curve as points (step, wall seconds
since the run's first record, value), and where the run was restarted (requeues, resumes).

Only what the run recorded is plotted: a curve without a single point is left out, never drawn
empty or invented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.readers import json_mapping
from hpctrain.runs.directory import RunDir
from hpctrain.runs.identity import job_chain

# (panel, curve label, record kind, key); a panel gathers curves of one unit
CURVES = [
    ("loss", "train loss", "train", "loss"),
    ("loss", "validation loss", "eval", "val_loss"),
    ("accuracy", "train accuracy", "train", "train_accuracy"),
    ("accuracy", "validation accuracy", "eval", "val_accuracy"),
    ("accuracy", "validation accuracy (EMA)", "eval", "val_accuracy_ema"),
    ("perplexity", "validation perplexity", "eval", "val_perplexity"),
    ("learning rate", "learning rate", "train", "lr"),
    ("throughput (samples/s)", "samples/s", "train", "samples_per_second"),
    ("data wait (share of step time)", "data wait", "train", "data_wait_fraction"),
    ("GPU utilisation (mean over ranks)", "GPU utilisation", "gpu", "utilization_mean"),
    ("GPU power (W, all ranks)", "GPU power", "gpu", "power_watts_total"),
    ("GPU memory (GiB, largest rank)", "GPU memory", "gpu", "memory_gib_max"),
]
PANELS = list(dict.fromkeys(panel for panel, *_ in CURVES))


@dataclass
class Curve:
    label: str
    points: list[tuple[int, float, float]] = field(default_factory=list)  # step, seconds, value


@dataclass
class RunSeries:
    """One run's curves by panel, its restarts, and what the report prints beside them."""

    path: Path
    name: str
    panels: dict[str, list[Curve]]
    restarts: list[tuple[int, float]]  # (step, seconds) where a later start resumed
    summary: dict
    config: dict
    identity: dict
    profile: dict | None  # profile/profile.json's verdict, when the run was profiled
    memory: dict | None  # hpctrain memory's prediction, when written into the run directory

    @property
    def jobs(self) -> list[str]:
        return job_chain(self.identity)


def _value(record: dict, key: str) -> float | None:
    if key == "memory_gib_max":  # the gpu record keeps bytes per rank
        sizes = [m for m in record.get("memory_used_bytes") or [] if isinstance(m, (int, float))]
        return max(sizes) / 2**30 if sizes else None
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value):
        return None
    return float(value)


def read_run(path: Path) -> RunSeries:
    run = RunDir(path)
    records = [r for r in run.read_metrics()[0]  # those a chart can place
               if isinstance(r.get("step"), (int, float)) and isinstance(r.get("time"),
                                                                         (int, float))]
    start = min((r["time"] for r in records), default=0.0)
    panels: dict[str, list[Curve]] = {}
    for panel, label, kind, key in CURVES:
        curve = Curve(label)
        for record in records:
            value = _value(record, key) if record.get("kind") == kind else None
            if value is not None:
                curve.points.append((int(record["step"]), record["time"] - start, value))
        if curve.points:
            panels.setdefault(panel, []).append(curve)
    identity = run.read_identity() or {}
    profile = (json_mapping(run.profile / "profile.json") or {}).get("verdict")
    predictions = run.memory_predictions()
    memory = (json_mapping(predictions[0]) or {}).get("estimate") if predictions else None
    return RunSeries(path=path, name=path.name, panels=panels,
                     restarts=_restarts(identity, records, start),
                     summary=run.read_summary() or {}, config=run.read_config() or {},
                     identity=identity, profile=profile,
                     memory=memory if isinstance(memory, dict) else None)


def _restarts(identity: dict, records: list[dict], start: float) -> list[tuple[int, float]]:
    """(step, seconds) of the first record after each start but the first."""
    marks = []
    starts = [s.get("time") for s in identity.get("starts", [])[1:] if isinstance(s, dict)]
    for began in starts:
        if not isinstance(began, (int, float)):
            continue
        after = next((r for r in records if r["time"] >= began), None)
        if after is not None:
            marks.append((int(after["step"]), after["time"] - start))
    return marks
