"""The recipe's operating sections: `preemption`, `tracking`, `monitor`.
"""

from __future__ import annotations

import signal
from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator

from hpctrain.sections import Section


class PreemptionConfig(Section):
    signal: str = Field("SIGUSR1", description="the signal that asks for a save-and-requeue; "
                                               "SIGTERM is always handled too")
    requeue: Literal["auto", "never"] = Field(
        "auto", description="auto: in a scheduler's job, rank 0 asks the scheduler to requeue "
        "it after saving")
    deadline: Literal["auto"] | float | None = Field(
        "auto", description="save and stop this long before the end: 'auto' reads the Slurm "
        "job's end time; or a time (ISO 8601, local unless it says otherwise, or Unix "
        "seconds); or null")
    deadline_margin_seconds: float = Field(300, ge=0, description="how long before the "
                                           "deadline the run saves and stops (room for the "
                                           "save)")
    max_requeues: int = Field(20, ge=0, description="stop requeueing a Slurm job after this "
                                                    "many restarts")

    @field_validator("deadline", mode="before")
    @classmethod
    def _as_unix_time(cls, value):
        if isinstance(value, datetime):  # YAML reads an unquoted ISO time as a datetime
            return value.timestamp()
        if isinstance(value, str) and value != "auto":
            try:
                return float(value)
            except ValueError:
                pass
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                raise ValueError(f"{value!r} is not a time: give Unix seconds, an ISO time "
                                 "such as 2026-11-22T18:00, 'auto' or null") from None
        return value

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
        if not hasattr(signal, name) or name in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"{value!r} is not a signal that can be caught; use e.g. SIGUSR1")
        return name


class TrackingConfig(Section):
    """Where the run's telemetry goes besides metrics.jsonl (report/trackers.py)."""

    sinks: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["tensorboard"], description="mlflow and wandb are extras "
        "(pip install 'hpctrain[mlflow]' / 'hpctrain[wandb]')")
    mlflow_uri: str | None = Field(None, description="an MLflow tracking URI; default: a file "
                                   "store in output_dir/mlruns")
    experiment: str | None = Field(None, description="MLflow experiment / W&B project "
                                   "(default: the recipe's name)")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline", description="offline: compute nodes have no internet; sync later with "
        "hpctrain runs sync RUN or wandb sync")

    @field_validator("sinks")
    @classmethod
    def _once_each(cls, value):
        return list(dict.fromkeys(value))


class MonitorConfig(Section):
    """What each rank samples in the background (monitor/): its GPU, or the CPU's energy."""

    enabled: bool = Field(True, description="sample GPU use and energy (NVML, else RAPL)")
    interval_seconds: float = Field(1.0, ge=0.05, le=60, description="between two samples")
    low_utilization: float = Field(0.5, ge=0, le=1, description="the watchdog warns when GPU "
                                   "utilisation stays under this ...")
    low_intervals: int = Field(3, ge=1, description="... for this many logging intervals")
    hang_after: float | Literal["auto", "off"] = Field(
        "auto", description="no progress for this long (seconds) in a step, an evaluation "
        "batch or a save is a hang: the stacks are kept, its place named, and the job "
        "requeued (monitor/hangs.py); auto: 20 times the phase's median so far, at least "
        "hang_floor_seconds; off: never")
    hang_floor_seconds: float = Field(300, gt=0, description="auto's least bound")
    hang_startup_seconds: float = Field(
        1800, gt=0, description="the bound during start-up and for the first of each phase "
        "(compilation, the workers' start, the first save)")
    hang_requeues: int = Field(2, ge=0, description="a job that hangs requeues itself this "
                               "many times a run; the next hang ends it (exit 1)")

    @field_validator("hang_after", mode="before")
    @classmethod
    def _off(cls, value):
        return "off" if value is False else value  # YAML reads a bare off as false

    @field_validator("hang_after")
    @classmethod
    def _positive(cls, value):
        if not isinstance(value, str) and value <= 0:
            raise ValueError(f"{value} is no bound: give seconds above 0, 'auto' or 'off'")
        return value
