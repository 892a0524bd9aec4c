"""`hpctrain profile RECIPE`: a few steps of the recipe's real training under torch.profiler.

The run is an ordinary run (its own run directory, config.yaml, summary.json) cut to
wait + warm-up + active + 1 optimiser steps. The wait steps hold what a long run does once
(DataLoader start-up, cuDNN autotuning, compilation); the warm-up steps are profiled and
discarded (the profiler's own start-up cost); the active steps are kept. The one extra step
lets the last active step end before the run's final evaluation and checkpoint. Each rank
writes `profile/trace.rank<R>.json.gz` in the run directory, under a temporary name renamed
when complete, so a killed run never leaves a half-written trace behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from hpctrain.cluster.environment import detect
from hpctrain.config import Config
from hpctrain.errors import RunFailed
from hpctrain.runs.directory import RunDir
from hpctrain.train.build import Parts
from hpctrain.train.loop import train
from hpctrain.writers import fresh_file, own_folder

@dataclass(frozen=True)
class Schedule:
    wait: int = 2
    warmup: int = 2
    active: int = 5

    @property
    def total_steps(self) -> int:
        return self.wait + self.warmup + self.active + 1


@dataclass
class ProfiledRun:
    run_dir: Path
    trace_dir: Path
    rank: int
    summary: dict | None  # rank 0 only


def trace_name(rank: int) -> str:
    return f"trace.rank{rank}.json.gz"


class _Recorder:
    """Steps the profiler's schedule once per optimiser step; exports the trace when ready."""

    def __init__(self, schedule: Schedule, rank: int):
        self.rank = rank
        self.run_dir: Path | None = None
        self.trace: Path | None = None
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=schedule.wait, warmup=schedule.warmup,
                                             active=schedule.active, repeat=1),
            on_trace_ready=self._export, record_shapes=True, profile_memory=True,
            with_stack=True)

    def step(self, parts: Parts, step: int) -> None:
        self.run_dir = parts.run_dir
        self.profiler.step()

    def _export(self, profiler) -> None:
        final = own_folder(RunDir(self.run_dir).profile) / trace_name(self.rank)
        descriptor, partial = fresh_file(final, ".gz")  # the .gz suffix makes torch compress
        os.close(descriptor)
        try:
            profiler.export_chrome_trace(str(partial))
            partial.replace(final)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        self.trace = final


def profile_run(config: Config, schedule: Schedule = Schedule()) -> ProfiledRun:
    """Train `schedule.total_steps` steps of `config` under the profiler; where the trace is."""
    env = detect()
    config = config.model_copy(update=dict(
        name=f"{config.name}-profile", resume=None,
        train=config.train.model_copy(update=dict(max_steps=schedule.total_steps))))
    recorder = _Recorder(schedule, env.rank)
    with recorder.profiler:
        summary = train(config, env, on_step=recorder.step)
    if recorder.trace is None:
        raise RunFailed(f"the profiled run ended before its {schedule.active} active steps: "
                        "no trace was written")
    return ProfiledRun(recorder.run_dir, recorder.trace.parent, env.rank, summary)
