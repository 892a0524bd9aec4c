"""The torch side of a LightningModule on hpctrain's engine (lightning.py says what is taken
and refuses what is not).

- `LightningStep`, the module the engine steps: its forward is the LightningModule's
  `training_step` (in train mode) or `validation_step` (in eval mode), so DDP's and FSDP's
  hooks see a forward like any other. It returns the loss and what the step logged.
- `Logs`: `self.log` and `self.log_dict`, replaced on the module, add each value into a
  device vector, slot by name (`CAPACITY` names a run), weighted by the batch's size as
  Lightning's `reduce_fx="mean"` is (`"sum"`: summed); a torchmetrics Metric logged is
  computed (and reset) when its figures are read, as Lightning computes it at an epoch's
  end. Nothing is read back in the step:
  the engine sums the vectors over micro-steps, intervals and ranks and reads them at its
  logging interval, so a training figure is its mean over the interval (Lightning logs the
  last step's), a validation figure its mean over the validation set. Every rank must log
  the same names in the same order, as Lightning asks of logged names.
- `EngineView`: what the module reads of `self.trainer` (`current_epoch`, `global_step`,
  `estimated_stepping_batches`, ranks, ...), from the engine's `Position`; any other
  attribute is refused, named.
"""

from __future__ import annotations

import dataclasses
import io
import numbers
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.tasks import tensors
from hpctrain.tasks.steps import Batch, Task

CAPACITY = 32  # names a module may log in one run
REDUCTIONS = ("mean", "sum")
METRIC = "metric"  # a torchmetrics Metric logged: its compute() over what it gathered


@dataclass
class Position:
    """Where the engine is, as a LightningModule asks it (the LR schedules advance it)."""

    steps: int = 0  # optimiser steps done: global_step
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


class StepOutput(NamedTuple):
    loss: torch.Tensor
    logged: torch.Tensor  # (2 * CAPACITY,): per slot, the weighted sum and the weight


class Logs:
    """The names a module logged, by slot, and what one step logged."""

    def __init__(self, device: torch.device):
        self.device = device
        self.names: list[str] = []
        self.reductions: list[str] = []
        self.rows: int | None = None  # the step's batch size, while a step runs
        self.pending: torch.Tensor | None = None
        self.metrics: dict[int, nn.Module] = {}  # slot -> the torchmetrics Metric logged there
        self.latest: dict[str, float | None] = {}  # read back: trainer.callback_metrics

    def begin(self, rows: int) -> None:
        self.rows = rows
        self.pending = torch.zeros(2 * CAPACITY, device=self.device, dtype=torch.float64)

    def __deepcopy__(self, memo) -> Logs:
        return self  # one per run: a copy of the module (the EMA's) logs into the same slots

    def take(self) -> torch.Tensor:
        pending, self.pending, self.rows = self.pending, None, None
        return pending

    def _slot(self, name: str, reduce_fx: str) -> int:
        if name in self.names:
            return self.names.index(name)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"self.log({name!r}, ...): the name is a non-empty string")
        if name in RESERVED:
            raise ConfigError(f"self.log({name!r}, ...): hpctrain records {name!r} itself in "
                              f"metrics.jsonl; log it under another name")
        if len(self.names) == CAPACITY:
            raise ConfigError(f"self.log({name!r}, ...): a run logs at most {CAPACITY} names "
                              f"on hpctrain's engine, and these were logged: "
                              f"{', '.join(self.names)}")
        self.names.append(name)
        self.reductions.append(reduce_fx)
        return len(self.names) - 1

    def add(self, name: str, value, reduce_fx="mean", batch_size: int | None = None,
            **ignored) -> None:
        """One `self.log` call (prog_bar, logger, on_step, on_epoch, sync_dist: the engine
        always sums over ranks and records every name)."""
        if self.pending is None:
            raise ConfigError(f"self.log({name!r}, ...) outside the steps and the epoch "
                              "hooks (in on_train_end or on_fit_end, or in configure_"
                              "optimizers): hpctrain's engine records what those log")
        if _is_metric(value):  # counted in this read's window; computed when read
            slot = self._slot(name, METRIC)
            self.metrics[slot] = value
            self.pending[2 * slot + 1] += 1
            return
        if reduce_fx not in REDUCTIONS:
            raise ConfigError(f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): hpctrain's "
                              f"engine reduces by {' or '.join(REDUCTIONS)}")
        slot = self._slot(name, reduce_fx)
        number = value if _is_real(value) else _number(name, value).to(self.device,
                                                                          torch.float64)
        weight = 1 if reduce_fx == "sum" else (batch_size or self.rows)
        self.pending[2 * slot] += number * weight
        self.pending[2 * slot + 1] += weight

    def add_dict(self, dictionary, **options) -> None:
        for name, value in dict(dictionary).items():
            self.add(name, value, **options)

    def values(self, sums: dict) -> dict:
        """The logged names with a weight in `sums` (read back): their means (or sums); a
        Metric's compute() over what it gathered since, then reset (on every rank alike,
        in slot order: its compute syncs the ranks)."""
        read = {}
        for slot, (name, reduction) in enumerate(zip(self.names, self.reductions)):
            total, weight = sums[f"{slot}:sum"], sums[f"{slot}:weight"]
            if weight > 0 and reduction == METRIC:
                read[name] = _computed(name, self.metrics[slot])
            elif weight > 0:
                read[name] = total if reduction == "sum" else total / weight
        self.latest.update(read)
        return read


RESERVED = ("step", "kind", "time", "epoch", "lr", "samples_per_second",
            "data_wait_fraction", "eval_seconds", "elapsed_seconds", "device_hours",
            "energy_joules")


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_metric(value) -> bool:
    return any(c.__name__ == "Metric" and c.__module__.startswith("torchmetrics")
               for c in type(value).__mro__)


def _computed(name: str, metric) -> float:
    """A logged Metric's value over what it gathered, the Metric reset for the next read."""
    value = metric.compute()
    metric.reset()
    return float(_number(name, value))


def _number(name: str, value) -> torch.Tensor:
    """A logged value as a 0-d tensor (detached), or a ConfigError saying what it was."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.detach().reshape(())
    if _is_real(value):
        return torch.tensor(float(value))
    what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else \
        f"a {type(value).__name__}"
    raise ConfigError(f"self.log({name!r}, ...) was given {what}: hpctrain's engine logs "
                      "one number per name (or a torchmetrics Metric giving one)")


def batch_rows(batch) -> int:
    """The batch's size: the length of its first tensor (Lightning's extract_batch_size)."""
    found = []
    tensors.each(batch, lambda value: found.append(value) if isinstance(
        value, torch.Tensor) and value.dim() > 0 else None)
    if not found:
        raise ConfigError("a batch without a tensor: hpctrain's engine counts a batch's "
                          "samples by its first tensor's length")
    return len(found[0])


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


def _your_line() -> str:
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
        raise NotGiven(f"self.trainer.{name}{_your_line()}: hpctrain's engine stands in for "
                       f"Lightning's Trainer with {', '.join(self.GIVEN)}")

    @property
    def _position(self) -> Position:
        return self._step.position

    current_epoch = property(lambda self: self._position.steps // self._position.steps_per_epoch)
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


class LightningStep(nn.Module):
    """The module the engine steps: forward runs the LightningModule's step on a batch;
    `at(moment)` its hooks at the loop's moments (`hooks`: moment -> the hook names, in
    Lightning's order: lightning.HOOKS)."""

    def __init__(self, module: nn.Module, device: torch.device,
                 hooks: dict[str, tuple[str, ...]], batch_hooks: frozenset[str] = frozenset()):
        super().__init__()
        self.module = module
        self.logs = Logs(device)
        self.position = Position()
        self.hooks = hooks
        self.own = batch_hooks  # the per-batch hooks the module defines: only those are called
        self.after: dict[str, list] = {moment: [] for moment in hooks}  # the engine's own
        self.optimizer = None  # configure_optimizers': set by the engine (lightning_optim)
        self.scheduler_configs: list[SchedulerConfig] = []
        self.datamodule = None  # the LightningDataModule the data came from, if any
        self.rows = 1  # the last training batch's size, what its hooks' logs weigh by
        self.carried: torch.Tensor | None = None  # what hooks outside the step logged
        self.last: tuple = ()  # (outputs, batch, batch_idx) of the last training batch
        self.trainer_view = EngineView(self)
        module.trainer = self.trainer_view  # the property's setter: child modules too
        module.log, module.log_dict = self.logs.add, self.logs.add_dict
        module.optimizers, module.lr_schedulers = self.optimizers, self.lr_schedulers
        module.all_gather = self.all_gather

    def optimizers(self, use_pl_optimizer: bool = True):
        """`self.optimizers()`: the module's one optimiser (the torch optimiser itself, where
        Lightning wraps it in a LightningOptimizer that passes its attributes through)."""
        if self.optimizer is None:
            raise ConfigError(f"self.optimizers(){_your_line()} before configure_optimizers "
                              "ran: hpctrain's engine makes the optimiser after setup; ask "
                              "for it in the steps or the epoch hooks")
        return self.optimizer

    def all_gather(self, data, group=None, sync_grads: bool = False):
        """`self.all_gather`: each tensor (or number) of `data` from every process, stacked
        (world_size, ...); on one process as it is, as Lightning's; `sync_grads`: through
        torch's differentiable all_gather."""
        import torch.distributed as dist

        def gather(value):
            tensor = torch.as_tensor(value, device=self.logs.device)
            if not dist.is_initialized() or dist.get_world_size(group) == 1:
                return tensor
            if sync_grads:
                from torch.distributed.nn.functional import all_gather

                return torch.stack(all_gather(tensor, group=group or dist.group.WORLD))
            parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            return torch.stack(parts)
        return tensors.each(data, gather)

    def lr_schedulers(self):
        """`self.lr_schedulers()`: None, the one scheduler, or a list, as Lightning's."""
        self.optimizers()  # made together
        schedulers = [config.scheduler for config in self.scheduler_configs]
        return (schedulers[0] if len(schedulers) == 1 else schedulers) if schedulers else None

    def to(self, *args, **kwargs) -> LightningStep:
        """Moved through the module's own `to`, which keeps its `self.device` true."""
        self.module.to(*args, **kwargs)
        return self

    def compile_forward(self, mode: str) -> LightningStep:
        """The module's forward compiled, as Lightning compiles it: the steps around it, with
        their logging, run as Python."""
        self.module.forward = torch.compile(self.module.forward, mode=mode)
        return self

    def at(self, moment: str) -> torch.Tensor:
        """The module's hooks at `moment`, then what the engine added there (a monitored LR
        schedule); what they logged, as a step's sums. After the last read (train_end)
        nothing is recorded: self.log there is refused, as Lightning refuses it."""
        window = moment != "train_end"
        if window:
            self.logs.begin(1)
        if moment == "validation_start":
            self.position.val_index = 0
        for hook in self.hooks[moment]:
            getattr(self.module, hook)()
        for then in self.after[moment]:
            then()
        return self._with_carried(self.logs.take()) if window else \
            torch.zeros(2 * CAPACITY, device=self.logs.device, dtype=torch.float64)

    def forward(self, batch, rows: int):
        self.logs.begin(rows)
        if self.training:
            index = self.position.batch_index()
            self.position.micro += 1
            self.rows = rows
            if "on_train_batch_start" in self.own and \
                    self.module.on_train_batch_start(batch, index) == -1:
                raise ConfigError(f"on_train_batch_start returned -1 at batch {index}: "
                                  "hpctrain's engine does not skip the rest of an epoch "
                                  "(every process must step alike); stop the run instead")
            returned = self.module.training_step(batch, index)
            loss = _loss_of(returned, index)
            extra = {k: v for k, v in returned.items() if k != "loss"} \
                if isinstance(returned, dict) else {}
            self.last = ({"loss": loss.detach(), **extra}, batch, index)
            return StepOutput(loss, self._with_carried(self.logs.take()))
        index = self.position.val_index
        if "on_validation_batch_start" in self.own:
            self.module.on_validation_batch_start(batch, index)
        outputs = self.module.validation_step(batch, index)
        if "on_validation_batch_end" in self.own:
            self.module.on_validation_batch_end(outputs, batch, index)
        self.position.val_index += 1
        # each sample carries its batch's share: evaluation drops the sampler's repeats by rows
        return (self.logs.take() / rows).expand(rows, -1)

    def hook(self, name: str, *args) -> None:
        """One of the module's per-batch hooks outside its step (on_before_backward, ...),
        where the module defines it: what it logs joins the next training step's figures, or
        the epoch end's."""
        if name not in self.own:
            return
        self.logs.begin(self.rows)
        getattr(self.module, name)(*args)
        logged = self.logs.take()
        self.carried = logged if self.carried is None else self.carried + logged

    def _with_carried(self, logged: torch.Tensor) -> torch.Tensor:
        carried, self.carried = self.carried, None
        return logged if carried is None else logged + carried

    def checkpoint_state(self) -> bytes:
        """What the module's on_save_checkpoint adds to a checkpoint dict (Lightning's holds
        its epoch and global_step besides), saved once as the file's bytes and checked to be
        readable back as tensors and plain values (every file hpctrain reads back is), or a
        ConfigError naming the key that is not."""
        given = {"epoch": self.trainer_view.current_epoch,
                 "global_step": self.position.steps}
        checkpoint = dict(given)
        self.module.on_save_checkpoint(checkpoint)
        added = {key: value for key, value in checkpoint.items() if key not in given}
        saved = _saved(added)
        if _readable(saved):
            return saved
        key = next(key for key, value in added.items() if not _readable(_saved(value)))
        raise ConfigError(
            f"{type(self.module).__name__}.on_save_checkpoint put checkpoint[{key!r}] = a "
            f"{type(added[key]).__name__}: hpctrain keeps tensors, numbers, strings and lists "
            "or dicts of them (it reads checkpoints back without running pickled code); store "
            "its state_dict() or its numbers")

    def restore_checkpoint_state(self, state: dict) -> None:
        """on_load_checkpoint, with what on_save_checkpoint added and the step it saved."""
        self.module.on_load_checkpoint({**state, "global_step": self.position.steps,
                                        "epoch": self.trainer_view.current_epoch})

    def batch_hooks(self, optimizer) -> dict:
        """The module's hooks at a training batch's moments, as train/step.BatchHooks takes
        them, in Lightning's order."""
        return dict(
            before_zero_grad=lambda: self.hook("on_before_zero_grad", optimizer),
            before_backward=lambda loss: self.hook("on_before_backward", loss),
            after_backward=lambda: self.hook("on_after_backward"),
            before_optimizer_step=lambda: self.hook("on_before_optimizer_step", optimizer),
            batch_end=lambda: self.hook("on_train_batch_end", *self.last))


def _saved(value) -> bytes:
    held = io.BytesIO()
    torch.save(value, held)
    return held.getvalue()


def _readable(saved: bytes) -> bool:
    """Whether torch reads `saved` back as tensors and plain values (weights_only)."""
    try:
        torch.load(io.BytesIO(saved), weights_only=True)
    except Exception:  # pickle's own error: what it would not read back
        return False
    return True


def _loss_of(returned, index: int) -> torch.Tensor:
    """training_step's loss: a tensor, or a dict's "loss"."""
    loss = returned.get("loss") if isinstance(returned, dict) else returned
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.reshape(())
    what = "None" if returned is None else f"a {type(returned).__name__}" + (
        f" of shape {tuple(returned.shape)}" if isinstance(returned, torch.Tensor) else "")
    raise ConfigError(f"training_step returned {what} at batch {index}: hpctrain's engine "
                      "takes the loss, a one-number tensor or a dict's 'loss' (it skips no "
                      "step: every process must step alike)")


def task(device: torch.device, step: LightningStep, name: str, unit: str,
         evaluates: bool) -> Task:
    """The engine's task record for `step`: the batch moved as it is, the loss and the
    logged sums as the step gave them; `evaluates`: the module has a validation_step."""
    names = tuple(f"{slot}:{part}" for slot in range(CAPACITY) for part in ("sum", "weight"))

    def to_device(batch, training: bool) -> Batch:
        batch = tensors.each(batch, lambda value: value.to(device, non_blocking=True)
                             if isinstance(value, torch.Tensor) else value)
        rows = batch_rows(batch)
        return WholeBatch({"batch": batch, "rows": rows}, None, torch.empty(rows))

    def loss(outputs, batch: Batch) -> torch.Tensor:
        return outputs.loss if isinstance(outputs, StepOutput) else outputs.new_zeros(())

    def sums(outputs, batch: Batch, loss, training: bool) -> torch.Tensor:
        return outputs.logged if isinstance(outputs, StepOutput) else outputs.sum(0)

    return Task(name, unit, names, None, to_device, loss, sums, step.logs.values,
                moment=step.at, evaluates=evaluates)


@dataclasses.dataclass
class WholeBatch(Batch):
    """A batch the module's step took whole. Its `labels` only count its rows (an empty
    tensor of that length: the engine counts samples by them); `first` keeps fewer rows,
    as evaluation leaves out the sampler's repeats by cutting the step's output, a share
    of what the batch logged per sample."""

    def first(self, rows: int) -> Batch:
        return WholeBatch(self.inputs, None, self.labels[:rows])
