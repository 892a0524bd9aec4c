"""The loop's bookkeeping between read-backs: the run's clock, the logging interval under way,
and the task's figures summed on the device.

Nothing here waits for the device inside a step: `RunningMetrics.add` only adds device tensors;
`read()`, once per logging interval, is the one synchronisation, and sums over all ranks.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from hpctrain.runs.goodput import STARTUP_PARTS
from hpctrain.tasks.steps import Task
from hpctrain.train.compilation import tally

DIP_REFERENCE = 16  # clean intervals whose median step time a save's dip is measured against
# the start-up's parts (run.json's split), each ending at a mark the loop makes
STARTUP_MARKS = dict(zip(STARTUP_PARTS, ("entered", "built", "resumed")))


@dataclass
class Clock:
    """Training time (evaluation and checkpointing excluded) and time spent waiting for data."""

    started: float = field(default_factory=time.perf_counter)
    train_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    steady_seconds: float = 0.0  # after the first logging interval (warm-up, compilation)
    steady_samples: int = 0
    steady_units: float = 0.0  # what the task's throughput counts (images, tokens)
    rank_seconds: list[float] = field(default_factory=list)  # steady time per rank (rank 0)
    rank_steps: int = 0
    stop_seconds: float | None = None  # from a stop signal to its checkpoint, when one came
    padded_samples: float = 0.0  # the padding shares of the task's intervals x their samples
    padding_samples: int = 0  # the samples of the intervals whose padding was measured
    monitor_rows: list = field(default_factory=list)  # every rank's last sampler row (rank 0)
    job_number: int | None = None  # this job's place among run.json's starts (rank 0)
    startup_seconds: float | None = None  # from the job's start to its training loop
    eval_seconds: float = 0.0  # this job's evaluations
    checkpoint_seconds: float = 0.0  # what this job's saves held the training for
    last_save_seconds: float = 0.0  # the last save's, until a logging interval reads it
    first_step: int = 0  # the step this job's training began at
    save_dip_seconds: float = 0.0  # training slowed by asynchronous saves writing meanwhile
    clean_step_seconds: deque = field(default_factory=lambda: deque(maxlen=DIP_REFERENCE))
    hung_seconds: float = 0.0  # without progress before the hang watch ended the job
    # the start-up's parts, perf_counter marks: entered train(), built, resumed
    marks: dict = field(default_factory=dict)
    compiled_before: dict = field(default_factory=tally)  # what earlier runs here compiled
    eval_compile_seconds: float = 0.0  # compiling inside this job's evaluations
    first_step_seconds: float | None = None  # from the job's start to its first step's end
    recompiling_told: bool = False  # a job that keeps compiling again is told once
    graph_skips_told: bool = False  # and one whose CUDA graphs torch skipped

    def add_padding(self, fraction: float, samples: int) -> None:
        """An interval's share of padded positions (a task that pads: token sequences, your
        batches with an attention_mask), over its `samples`."""
        self.padded_samples += fraction * samples
        self.padding_samples += samples

    @property
    def padding_fraction(self) -> float | None:
        """The share of padded positions in this job's batches (each logging interval's,
        weighted by its samples); None where the task measured none."""
        return self.padded_samples / self.padding_samples if self.padding_samples else None

    def began(self) -> float:
        """When this job began, in Unix seconds."""
        return time.time() - (time.perf_counter() - self.started)

    def mark(self, moment: str) -> None:
        """The start-up reached `moment` (STARTUP_MARKS)."""
        self.marks[moment] = time.perf_counter()

    def split(self, step: int) -> dict:
        """This job's seconds by phase so far (run.json's `split`, `hpctrain goodput`):
        training (to the last logging interval read, its data wait and its save dip
        within) and the steps it trained; the start-up's parts; compiling (within training
        and evaluation: torch's count), and when the first step ended."""
        return {"startup": self.startup_seconds, "training": self.train_seconds,
                "data_wait": self.data_wait_seconds, "evaluation": self.eval_seconds,
                "checkpoint": self.checkpoint_seconds, "save_dip": self.save_dip_seconds,
                "hung": self.hung_seconds, "steps": step - self.first_step,
                **self.startup_parts(), **self.compiled(),
                "compilation_in_evaluation": self.eval_compile_seconds,
                "first_step": self.first_step_seconds}

    def startup_parts(self) -> dict:
        """The start-up's seconds by part, each from the mark before it (imports: from the
        process's start); a part not reached is left out."""
        parts, before = {}, self.started
        for name, moment in STARTUP_MARKS.items():
            if moment in self.marks:
                parts[name] = max(0.0, self.marks[moment] - before)
                before = self.marks[moment]
        return parts

    def compiled(self) -> dict:
        """What this job has compiled so far (compilation.tally; this process's earlier runs
        left out)."""
        return {name: max(0.0, value - self.compiled_before[name])
                for name, value in tally().items()}

    def count_save_dip(self, seconds: float, waited: float, steps: int, saving: int) -> None:
        """An interval read: `seconds` of it, `waited` for data, `steps` trained, `saving` of
        them while an asynchronous save wrote in the background. The dip is what such an
        interval took beyond its steps at the median step time of recent intervals without
        a save (data waits excluded: they are counted as such); those intervals set that
        time. Before any clean interval, nothing is counted."""
        if not steps:
            return
        computing = max(0.0, seconds - waited)
        if not saving:
            self.clean_step_seconds.append(computing / steps)
        elif self.clean_step_seconds:
            usual = statistics.median(self.clean_step_seconds)
            self.save_dip_seconds += max(0.0, computing - steps * usual)


@dataclass
class Interval:
    """The logging interval under way: when it started, what it trained, how long it waited."""

    start: float = field(default_factory=time.perf_counter)
    samples: int = 0
    wait_mark: float = 0.0  # clock.data_wait_seconds at the start
    first: bool = True  # the first interval holds warm-up (and compilation): not steady
    saving: int = 0  # steps taken while an asynchronous save wrote in the background


class RunningMetrics:
    """The loss per micro-step and the task's sums, kept on the device."""

    def __init__(self, device: torch.device, task: Task):
        self.device, self.task = device, task
        self.reset()

    def reset(self) -> None:
        # loss, non-finite count, then the task's sums
        # float64: token counts pass float32's exact integers (2**24) within an interval
        self.sums = torch.zeros(2 + len(self.task.sum_names), device=self.device,
                                dtype=torch.float64)
        self.samples = 0
        self.micro_steps = 0

    def add(self, loss: torch.Tensor, task_sums: torch.Tensor, samples: int) -> None:
        finite = torch.isfinite(loss)
        self.sums += torch.cat([torch.stack([torch.where(finite, loss, 0.0), ~finite]),
                                task_sums.to(self.sums.dtype)])
        self.samples += samples
        self.micro_steps += 1

    def add_sums(self, task_sums: torch.Tensor) -> None:
        """The task's sums from outside a step (what it logged at one of the loop's moments)."""
        self.sums[2:] += task_sums.to(self.sums.dtype)

    def read(self, distributed) -> dict:
        """Sums over all ranks since the last read, then reset: `loss` (the mean over finite
        micro-steps), `all_nonfinite`, `units` (what throughput counts) and the task's
        metrics."""
        counts = torch.tensor([self.samples, self.micro_steps], device=self.device)
        totals = distributed.sum_(torch.cat([self.sums, counts.to(self.sums.dtype)]))
        loss_sum, nonfinite, *task_sums, samples, micro_steps = totals.tolist()
        sums = dict(zip(self.task.sum_names, task_sums))
        finite_steps = micro_steps - nonfinite
        values = {**self.task.values(sums),
                  "loss": loss_sum / finite_steps if finite_steps else math.nan,
                  "all_nonfinite": nonfinite == micro_steps and micro_steps > 0,
                  "units": sums[self.task.unit_sum] if self.task.unit_sum else samples}
        self.reset()
        return values
