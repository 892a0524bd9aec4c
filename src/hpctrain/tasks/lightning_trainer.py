"""What a LightningModule reads of `self.trainer` on hpctrain's engine: `EngineView`, from
the engine's `Position` (`current_epoch`, `global_step`, `estimated_stepping_batches`, ranks,
...), its optimiser and schedulers, and what its callbacks ask (`should_stop`, the
strategy's decisions); any other attribute is refused, naming it and the user's line that
reached it.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hpctrain.errors import ConfigError

if TYPE_CHECKING:
    from hpctrain.tasks.lightning_step import LightningStep


@dataclass
class Position:
    """Where the engine is, as a LightningModule asks it (the LR schedules advance it)."""

    steps: int = 0  # optimiser steps done: global_step
    epoch: int = 0  # current_epoch: the epoch under way until its end's hooks are done
    micro: int = 0  # training micro-batches since the last optimiser step
    val_index: int = 0  # validation batches since the evaluation began
    steps_per_epoch: int = 1
    accumulate: int = 1
    total_steps: int = 0
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    num_nodes: int = 1
    run_dir: Path | None = None

    def __deepcopy__(self, memo) -> Position:
        return self  # one per run, as the engine's step is

    def batch_index(self) -> int:
        """Lightning's batch_idx: the training batch's number within its epoch."""
        return (self.steps % self.steps_per_epoch) * self.accumulate + self.micro


@dataclass
class SchedulerConfig:
    """A scheduler as configure_optimizers configured it: the fields of Lightning's
    LRSchedulerConfig (`self.trainer.lr_scheduler_configs`, LearningRateMonitor's reading)."""

    scheduler: object  # a torch.optim.lr_scheduler.LRScheduler
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None  # the logged figure it steps on (ReduceLROnPlateau)
    name: str | None = None
    strict: bool = True

    @property
    def reduce_on_plateau(self) -> bool:
        return self.monitor is not None


def your_line() -> str:
    """Where your code made the call that reached a refusal: the innermost frame outside
    Lightning, torch and hpctrain, as ' (reached from lit.py:42: self.clip_gradients(opt))'."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if not any(part in path for part in ("/lightning/", "/pytorch_lightning/", "/torch/",
                                             "/hpctrain/", "/lightning_fabric/")):
            return f" (reached from {Path(frame.filename).name}:{frame.lineno}: {frame.line})"
    return ""


class NotGiven(ConfigError, AttributeError):
    """What the engine's `self.trainer` does not give: a refusal (exit 2) that `hasattr`
    and `getattr(trainer, name, default)` still read as a missing attribute."""


class EngineView:
    """`self.trainer` for a LightningModule on hpctrain's engine."""

    GIVEN = ("current_epoch", "global_step", "estimated_stepping_batches", "max_epochs",
             "max_steps", "num_training_batches", "accumulate_grad_batches", "world_size",
             "global_rank", "local_rank", "node_rank", "num_nodes", "num_devices",
             "is_global_zero", "training", "sanity_checking", "callback_metrics",
             "logged_metrics", "log_dir", "default_root_dir", "logger", "loggers",
             "progress_bar_callback", "lightning_module", "optimizers",
             "lr_scheduler_configs", "datamodule")

    def __init__(self, step: LightningStep):
        self._step = step

    def __getattr__(self, name: str):
        raise NotGiven(f"self.trainer.{name}{your_line()}: hpctrain's engine stands in for "
                       f"Lightning's Trainer with {', '.join(self.GIVEN)}")

    @property
    def _position(self) -> Position:
        return self._step.position

    current_epoch = property(lambda self: self._position.epoch)
    global_step = property(lambda self: self._position.steps)
    estimated_stepping_batches = property(lambda self: self._position.total_steps)
    max_steps = property(lambda self: self._position.total_steps)
    max_epochs = property(lambda self: -(-self._position.total_steps //
                                         self._position.steps_per_epoch))
    num_training_batches = property(lambda self: self._position.steps_per_epoch *
                                    self._position.accumulate)
    accumulate_grad_batches = property(lambda self: self._position.accumulate)
    world_size = property(lambda self: self._position.world_size)
    global_rank = property(lambda self: self._position.rank)
    local_rank = property(lambda self: self._position.local_rank)
    node_rank = property(lambda self: self._position.rank // self._position.local_world_size)
    num_nodes = property(lambda self: self._position.num_nodes)
    num_devices = property(lambda self: self._position.local_world_size)
    is_global_zero = property(lambda self: self._position.rank == 0)
    training = property(lambda self: self._step.training)
    sanity_checking = property(lambda self: False)
    callback_metrics = property(lambda self: {k: torch.tensor(v) for k, v in
                                              self._step.logs.latest.items() if v is not None})
    logged_metrics = callback_metrics
    log_dir = property(lambda self: str(self._position.run_dir))
    default_root_dir = log_dir
    logger = property(lambda self: None)
    loggers = property(lambda self: [])
    progress_bar_callback = property(lambda self: None)
    lightning_module = property(lambda self: self._step.module)
    optimizers = property(lambda self: [self._step.optimizers()])
    lr_scheduler_configs = property(lambda self: list(self._step.scheduler_configs))
    datamodule = property(lambda self: self._step.datamodule)
