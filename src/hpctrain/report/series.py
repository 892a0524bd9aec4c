"""What a report plots, read from a run directory: every curve as points (step, wall seconds
since the run's first record, value), and where the run was restarted (requeues, resumes).

Only what the run recorded is plotted: a curve without a single point is left out, never drawn
empty or invented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.profiling.verdict import CLASSES
from hpctrain.readers import (COUNT, FLAG, MAPPING, TEXT, Kind, field_problem, json_mapping,
                              list_of, optional)
from hpctrain.runs.directory import CAPS, MEMORY_PREDICTION, PROFILE_SUMMARY, RunDir
from hpctrain.runs.identity import job_chain, read_identity
from hpctrain.tasks.registry import task_curves

# (panel, curve label, record kind, key); a panel gathers curves of one unit
CURVES = [
    ("loss", "train loss", "train", "loss"),
    ("loss", "validation loss", "eval", "val_loss"),
    *((c.panel, c.label, c.kind, c.key) for c in task_curves()),  # each task's own (a key
    # every run has, val_loss, is drawn once: tests/*/test_report.py checks)
    ("learning rate", "learning rate", "train", "lr"),
    ("throughput (samples/s)", "samples/s", "train", "samples_per_second"),
    ("data wait (share of step time)", "data wait", "train", "data_wait_fraction"),
    ("GPU utilisation (mean over ranks)", "GPU utilisation", "gpu", "utilization_mean"),
    ("GPU power (W, all ranks)", "GPU power", "gpu", "power_watts_total"),
    ("GPU memory (GiB, largest rank)", "GPU memory", "gpu", "memory_gib_max"),
]
PANELS = list(dict.fromkeys(panel for panel, *_ in CURVES))
# what the report prints of profile.json's verdict and of a memory prediction
VERDICT_RULES = {"bound": Kind(f"one of {', '.join(CLASSES)}", lambda v: v in CLASSES),
                 "reason": TEXT, "recommendations": list_of(MAPPING | TEXT)}
ESTIMATE_RULES = {"device": TEXT, "batch_size": COUNT, "precision": TEXT,
                  "peak_allocated_bytes": COUNT, "in_use_bytes": COUNT, "fits": optional(FLAG)}


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
    damage: list[str] = field(default_factory=list)  # files left out, and why

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
    records, _, metrics_damage = run.read_metrics()
    records = [r for r in records if "step" in r and "time" in r]  # those a chart can place
    start = min((r["time"] for r in records), default=0.0)
    panels: dict[str, list[Curve]] = {}
    for panel, label, kind, key in CURVES:
        curve = Curve(label)
        for record in records:
            value = _value(record, key) if record.get("kind") == kind else None
            if value is not None:
                curve.points.append((record["step"], record["time"] - start, value))
        if curve.points:
            panels.setdefault(panel, []).append(curve)
    identity, identity_damage = read_identity(path)
    profile, profile_damage = _part(run.profile / PROFILE_SUMMARY, CAPS[PROFILE_SUMMARY],
                                    "verdict", VERDICT_RULES, ("bound", "reason"))
    predictions = run.memory_predictions()
    memory, memory_damage = _part(predictions[0], CAPS[MEMORY_PREDICTION], "estimate",
                                  ESTIMATE_RULES,
                                  tuple(k for k in ESTIMATE_RULES if k != "fits")) \
        if predictions else (None, None)
    summary, summary_damage = run.summary_and_damage()
    return RunSeries(path=path, name=path.name, panels=panels,
                     restarts=_restarts(identity or {}, records, start),
                     summary=summary or {}, config=run.read_config() or {},
                     identity=identity or {}, profile=profile, memory=memory,
                     damage=[d for d in (summary_damage, identity_damage, metrics_damage,
                                         profile_damage, memory_damage) if d is not None])


def _part(path: Path, cap: int, key: str, rules: dict[str, Kind], required: tuple[str, ...]) \
        -> tuple[dict | None, str | None]:
    """The mapping under `key` in the JSON file `path`, checked by `rules`: (part, None), or
    (None, why) when the file holds one that breaks them; (None, None) when it has none."""
    part = (json_mapping(path, cap) or {}).get(key)
    if not isinstance(part, dict):
        return None, None
    why = field_problem(part, rules, required)
    return (part, None) if why is None else (None, f"{path.name}: {key}.{why}")


def _restarts(identity: dict, records: list[dict], start: float) -> list[tuple[int, float]]:
    """(step, seconds) of the first record after each start but the first."""
    marks = []
    for began in [s.get("time") for s in identity.get("starts", [])[1:]]:
        if began is None:
            continue
        after = next((r for r in records if r["time"] >= began), None)
        if after is not None:
            marks.append((after["step"], after["time"] - start))
    return marks
