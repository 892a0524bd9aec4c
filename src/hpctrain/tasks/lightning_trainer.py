"""What a LightningModule reads of `self.trainer` on hpctrain's engine: `EngineView`, from
the engine's `Position` (`current_epoch`, `global_step`, `estimated_stepping_batches`, ranks,
...), its optimiser and schedulers, and what its callbacks ask (`should_stop`, the
strategy's decisions); any other attribute is refused, naming it and the user's line that
reached it.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from types import SimpleNamespace
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.errors import ConfigError


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
    eval_every_epochs: float = 1.0  # train.eval_every_epochs: Lightning's val_check_interval

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


CLIPPING = ("gradient_clip_val", "gradient_clip_algorithm")  # the Trainer's clipping settings


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
             "lr_scheduler_configs", "datamodule", "should_stop", "strategy", "state",
             "fast_dev_run", "val_check_interval", "check_val_every_n_epoch", "callbacks",
             "early_stopping_callback")

    def __init__(self, step):
        self._step = step  # the lightning_step.LightningStep whose module asks

    def __getattr__(self, name: str):
        if name in CLIPPING:  # self.clip_gradients(...) asks these first
            raise NotGiven(f"self.clip_gradients{your_line()}: hpctrain's engine clips the "
                           "gradients itself: set optim.grad_clip_norm and take the call out")
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
    state = property(lambda self: SimpleNamespace(fn="fit", stage="train" if self._step.training
                                                  else "validate"))
    fast_dev_run = property(lambda self: False)
    val_check_interval = property(lambda self: min(self._position.eval_every_epochs, 1.0))
    check_val_every_n_epoch = property(lambda self: max(1, round(
        self._position.eval_every_epochs)))
    callbacks = property(lambda self: list(self._step.callbacks))
    early_stopping_callback = property(lambda self: next(
        (callback for callback in self._step.callbacks
         if type(callback).__name__ == "EarlyStopping"), None))

    @property
    def should_stop(self) -> bool:
        return self._step.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        """A callback's (or the module's) ask to end the run after this step."""
        self._step.should_stop = bool(value)

    @property
    def strategy(self) -> EngineStrategy:
        return EngineStrategy(self._step.logs.device)


class EngineStrategy:
    """`self.trainer.strategy` as a callback asks it: the ranks' decisions and objects."""

    def __init__(self, device: torch.device):
        self.device = device

    def __getattr__(self, name: str):
        raise NotGiven(f"self.trainer.strategy.{name}{your_line()}: hpctrain's engine answers "
                       "reduce_boolean_decision, broadcast and barrier")

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Every rank's `decision` combined: all of them (`all`) or any of them."""
        if not dist.is_initialized():
            return bool(decision)
        count = torch.tensor(int(bool(decision)), device=self.device)
        dist.all_reduce(count)
        return bool(count == dist.get_world_size()) if all else bool(count > 0)

    def broadcast(self, obj, src: int = 0):
        if not dist.is_initialized():
            return obj
        held = [obj]
        dist.broadcast_object_list(held, src=src)
        return held[0]

    def barrier(self, name: str | None = None) -> None:
        if dist.is_initialized():
            dist.barrier()
