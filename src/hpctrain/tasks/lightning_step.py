"""The torch side of a LightningModule on hpctrain's engine (lightning.py says what is taken
and refuses what is not).

- `LightningStep`, the module the engine steps: its forward is the LightningModule's
  `training_step` (in train mode) or `validation_step` (in eval mode), so DDP's and FSDP's
  hooks see a forward like any other. It returns the loss and what the step logged.
- `self.log` and `self.log_dict`, replaced on the module, go to `lightning_logs.Logs`, which
  names and reduces them as Lightning does; every rank must log the same names in the same
  order, as Lightning asks of logged names. What the training logs is also summed over the
  epoch (on this rank), read over all ranks at the epoch's end and kept in checkpoints.
- `self.trainer` is lightning_trainer.EngineView.
"""

from __future__ import annotations

import dataclasses
import io
from typing import NamedTuple

import torch
from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.tasks import tensors
from hpctrain.tasks.lightning_logs import (CAPACITY, EPOCH, EVALUATION, INTERVAL, SUM_NAMES,
                                          Logs, metric_states, restore_metric_states, where)
from hpctrain.tasks.lightning_trainer import (EngineView, Position, SchedulerConfig,
                                             your_line)
from hpctrain.tasks.steps import Batch, Task

ENGINE_KEY = "hpctrain"  # in module.pt, beside what on_save_checkpoint added


class StepOutput(NamedTuple):
    loss: torch.Tensor
    logged: torch.Tensor  # (2 * CAPACITY,): per slot, the weighted sum and the weight


def batch_rows(batch) -> int:
    """The batch's size: the length of its first tensor (Lightning's extract_batch_size)."""
    found = []
    tensors.each(batch, lambda value: found.append(value) if isinstance(
        value, torch.Tensor) and value.dim() > 0 else None)
    if not found:
        raise ConfigError("a batch without a tensor: hpctrain's engine counts a batch's "
                          "samples by its first tensor's length")
    return len(found[0])


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
        # what the training logged this epoch, on this rank; the sum over ranks: reduce
        self.epoch_sums = torch.zeros(2 * CAPACITY, device=device, dtype=torch.float64)
        self.reduce = _one_process  # the engine's sum over ranks (Distributed.sum_)
        self.epoch_figures: dict = {}  # the last epoch's, until the engine records them
        self.callbacks: list = []  # your callbacks run as they are (lightning_callbacks.py)
        self.listeners: dict[str, list] = {}  # hook -> the callbacks defining it, in order
        self.monitoring: list = []  # those called at on_train_epoch_end after the module
        self.should_stop = False  # trainer.should_stop: a callback's (or the module's) ask
        self.stop_reason: str | None = None  # who asked, and why
        self.keep_best = None  # ModelCheckpoint's choice (lightning_callbacks.KeepBest)
        self.lr_figures = None  # LearningRateMonitor's reading (lightning_callbacks.py)
        self.lr_seen: dict[str, float] = {}  # its figures as the last step began
        self.notes: list[str] = []  # the banner's words for the callbacks
        self.trainer_view = EngineView(self)
        module.trainer = self.trainer_view  # the property's setter: child modules too
        module.log, module.log_dict = self.logs.add, self.logs.add_dict
        module.optimizers, module.lr_schedulers = self.optimizers, self.lr_schedulers
        module.all_gather = self.all_gather

    def optimizers(self, use_pl_optimizer: bool = True):
        """`self.optimizers()`: the module's one optimiser (the torch optimiser itself, where
        Lightning wraps it in a LightningOptimizer that passes its attributes through)."""
        if self.optimizer is None:
            raise ConfigError(f"self.optimizers(){your_line()} before configure_optimizers "
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

    def add_callbacks(self, callbacks) -> None:
        """Your callbacks (a lightning_callbacks.Callbacks): those run as they are are set up
        (their setup("fit"), after the module's) and called at each hook before the
        module's; ModelCheckpoint's and LearningRateMonitor's translations kept."""
        self.callbacks = callbacks.run
        self.listeners = callbacks.by_hook()
        self.monitoring = callbacks.listening("on_train_epoch_end", monitoring=True)
        self.keep_best, self.lr_figures = callbacks.keep_best, callbacks.lr_reader()
        self.notes = callbacks.notes
        for callback in self.listeners.get("setup", ()):
            self._callback(callback, "setup", stage="fit")  # by name, as Lightning

    def _call(self, hook: str, *args, module_defines: bool = True):
        """`hook` of the callbacks that define it, then the module's (where it defines it),
        as Lightning calls them; the module's answer."""
        for callback in self.listeners.get(hook, ()):
            self._callback(callback, hook, *args)
        if not module_defines:
            return None
        self.logs.where = where(hook)
        answer = getattr(self.module, hook)(*args)
        self._asked_to_stop(f"{type(self.module).__name__}.{hook}", None)
        return answer

    def _callback(self, callback, hook: str, *args, **kwargs) -> None:
        """One callback's hook, with the engine's view as its trainer; a Lightning
        callback's own failure (a monitored figure never logged) said as a ConfigError."""
        self.logs.where = where(hook)
        try:
            getattr(callback, hook)(self.trainer_view, self.module, *args, **kwargs)
        except ConfigError:
            raise
        except Exception as err:
            if not type(callback).__module__.startswith(("lightning.", "pytorch_lightning.")):
                raise  # your callback's: its own traceback
            raise ConfigError(f"Lightning's {type(callback).__name__}.{hook}: "
                              f"{str(err).strip().splitlines()[0]}") from None
        self._asked_to_stop(type(callback).__name__,
                            getattr(callback, "stopping_reason_message", None))

    def _asked_to_stop(self, who: str, why: str | None) -> None:
        if self.should_stop and self.stop_reason is None:
            self.stop_reason = f"{who} set trainer.should_stop" + (f": {why}" if why else "")

    def stop_asked(self) -> str | None:
        """Why the run is to end after this step (a callback's trainer.should_stop), or
        None."""
        return self.stop_reason if self.should_stop else None

    def ranked_checkpoints(self, kept: list, step: int, evaluated: bool) -> list:
        """ModelCheckpoint's best checkpoints ([step, value], as saved) with the one of
        `step` ranked in by its monitored figure, or a ConfigError once an evaluation has
        run and the figure is still not logged."""
        value = self.logs.latest.get(self.keep_best.monitor)
        if value is not None:
            return self.keep_best.ranked(kept, step, float(value))
        if evaluated:
            raise ConfigError(f"ModelCheckpoint(monitor={self.keep_best.monitor!r}): the "
                              "module has not logged it (logged: "
                              f"{', '.join(self.logs.latest) or 'nothing'})")
        return kept

    def to(self, *args, **kwargs) -> LightningStep:
        """Moved through the module's own `to`, which keeps its `self.device` true."""
        self.module.to(*args, **kwargs)
        return self

    def compile_forward(self, mode: str) -> LightningStep:
        """The module's forward compiled, as Lightning compiles it: the steps around it, with
        their logging, run as Python."""
        self.module.forward = torch.compile(self.module.forward, mode=mode)
        return self

    def at(self, moment: str, so_far: torch.Tensor | None = None) -> torch.Tensor:
        """The module's hooks at `moment`, then what the engine added there (a monitored LR
        schedule); what they logged, as a step's sums. At the training epoch's end the
        epoch's figures are read over all ranks first (`epoch_figures`), as Lightning reads
        them before it steps a monitored schedule. After the last read (train_end) nothing
        is recorded: self.log there is refused, as Lightning refuses it. At the ends of an
        epoch and of an evaluation (`so_far`: its sums on this rank), each hook's
        `trainer.callback_metrics` holds the figures so far, as Lightning's computes them
        when asked (`_look`)."""
        window = moment != "train_end"
        if window:
            self.logs.begin(1)
        if moment == "validation_start":
            self.position.val_index = 0
        if moment in ("train_start", "train_epoch_start"):  # a resume's too
            self.position.epoch = self.position.steps // self.position.steps_per_epoch
        for hook in self.hooks[moment]:
            self._look(moment, so_far)
            self._call(hook)
        logged = self.logs.take() if window else \
            torch.zeros(2 * CAPACITY, device=self.logs.device, dtype=torch.float64)
        if "validation" not in moment:
            self._training_logged(logged)
        if moment == "train_epoch_end":  # the epoch's figures, then who monitors them
            self.epoch_figures = self._read_epoch()
            for callback in self.monitoring:
                self._callback(callback, "on_train_epoch_end")
        for then in self.after[moment]:
            then()
        if moment == "train_epoch_end":
            self.position.epoch += 1
        return logged

    def _look(self, moment: str, so_far: torch.Tensor | None) -> None:
        """The figures of the evaluation or the training epoch so far (what the moment's
        hooks logged before included), over all ranks, into callback_metrics without
        reading them (a Metric is computed, not reset): a collective on every rank alike."""
        if moment == "validation_end" and so_far is not None:
            sums, read = so_far.to(self.logs.pending.dtype), EVALUATION
        elif moment == "train_epoch_end" and self.logs.reads_epochs():
            sums, read = self.epoch_sums, EPOCH
        else:
            return
        total = self.reduce(sums + self.logs.pending)
        self.logs.values(dict(zip(SUM_NAMES, total.tolist())), read, reset=False)

    def _read_epoch(self) -> dict:
        """The epoch's on_epoch figures, summed over ranks (a collective, once an epoch, only
        where the module logs any), under Lightning's names; the epoch's sums restart."""
        sums = self.reduce(self.epoch_sums.clone()) if self.logs.reads_epochs() else None
        self.epoch_sums.zero_()
        return {} if sums is None else \
            self.logs.values(dict(zip(SUM_NAMES, sums.tolist())), EPOCH)

    def take_epoch_figures(self) -> dict:
        figures, self.epoch_figures = self.epoch_figures, {}
        return figures

    def _training_logged(self, logged: torch.Tensor) -> torch.Tensor:
        """What the training logged, added to the epoch's sums (no read-back)."""
        self.epoch_sums += logged
        return logged

    def forward(self, batch, rows: int):
        self.logs.begin(rows)
        if self.training:
            index = self.position.batch_index()
            self.position.micro += 1
            self.rows = rows
            if self.lr_figures is not None and self.position.micro == 1:  # as the step begins
                self.lr_seen = self.lr_figures(self.optimizer, self.scheduler_configs)
            if self._call("on_train_batch_start", batch, index,
                          module_defines="on_train_batch_start" in self.own) == -1:
                raise ConfigError(
                    f"on_train_batch_start returned -1 at batch {index}: hpctrain's engine "
                    "does not skip the rest of an epoch (every process must step alike); "
                    "stop the run instead")
            self.logs.where = where("training_step")
            returned = self.module.training_step(batch, index)
            loss = _loss_of(returned, index)
            extra = {k: v for k, v in returned.items() if k != "loss"} \
                if isinstance(returned, dict) else {}
            self.last = ({"loss": loss.detach(), **extra}, batch, index)
            return StepOutput(loss, self.logs.take())
        index = self.position.val_index
        self._call("on_validation_batch_start", batch, index,
                   module_defines="on_validation_batch_start" in self.own)
        self.logs.where = where("validation_step")
        outputs = self.module.validation_step(batch, index)
        self._call("on_validation_batch_end", outputs, batch, index,
                   module_defines="on_validation_batch_end" in self.own)
        self.position.val_index += 1
        # each sample carries its batch's share: evaluation drops the sampler's repeats by rows
        return (self.logs.take() / rows).expand(rows, -1)

    def hook(self, name: str, *args) -> None:
        """One of the module's per-batch hooks outside its step (on_before_backward, ...),
        where the module defines it: what it logs is carried to the engine's next taking
        (`step_logged` or `after_step`)."""
        if name not in self.own and not self.listeners.get(name):
            return
        self.logs.begin(self.rows)
        self._call(name, *args, module_defines=name in self.own)
        logged = self.logs.take()
        self.carried = logged if self.carried is None else self.carried + logged

    def step_logged(self, output: StepOutput) -> torch.Tensor:
        """A training micro-batch's logged sums as the engine records them: its step's and
        what the hooks before its backward logged (carried)."""
        return self._training_logged(self._with_carried(output.logged))

    def after_step(self) -> torch.Tensor | None:
        """What the hooks after the step's figures were recorded logged
        (on_before_optimizer_step, on_train_batch_end), for the interval under way; None
        where they logged nothing (no device work)."""
        carried, self.carried = self.carried, None
        return None if carried is None else self._training_logged(carried)

    def _with_carried(self, logged: torch.Tensor) -> torch.Tensor:
        carried, self.carried = self.carried, None
        return logged if carried is None else logged + carried

    def checkpoint_state(self) -> bytes:
        """What the callbacks' and the module's on_save_checkpoint add to a checkpoint dict
        (Lightning's holds its epoch and global_step besides), with the engine's own state
        (ENGINE_KEY: the epoch's logged sums so far over all ranks, a collective; the logged
        Metrics' states; the callbacks' state_dicts), saved once as the file's bytes and
        checked to be readable back as tensors and plain values (every file hpctrain reads
        back is), or a ConfigError naming the key that is not."""
        engine = {"slots": self.logs.state(), "metrics": metric_states(
            self.module, [metric for _, metric in sorted(self.logs.metrics.items())]),
            "epoch_sums": self.reduce(self.epoch_sums.clone()).cpu(),
            "callbacks": {callback.state_key: callback.state_dict()
                          for callback in self.callbacks}}
        given = {"epoch": self.trainer_view.current_epoch,
                 "global_step": self.position.steps}
        checkpoint = dict(given)
        for callback in self.listeners.get("on_save_checkpoint", ()):
            self._callback(callback, "on_save_checkpoint", checkpoint)
        self.module.on_save_checkpoint(checkpoint)
        added = {key: value for key, value in checkpoint.items() if key not in given}
        if ENGINE_KEY in added:
            raise ConfigError(f"{type(self.module).__name__}.on_save_checkpoint put "
                              f"checkpoint[{ENGINE_KEY!r}]: hpctrain keeps its own state under "
                              "that key; use another")
        saved = _saved({**added, ENGINE_KEY: engine})
        if _readable(saved):
            return saved
        key = next((key for key, value in added.items() if not _readable(_saved(value))),
                   ENGINE_KEY)
        what = added[key] if key in added else engine["callbacks"]
        raise ConfigError(
            f"on_save_checkpoint (or a callback's state_dict) put checkpoint[{key!r}] = a "
            f"{type(what).__name__} holding more than hpctrain keeps: tensors, numbers, strings "
            "and lists or dicts of them (it reads checkpoints back without running pickled "
            "code); store its state_dict() or its numbers")

    def restore_checkpoint_state(self, state: dict, source: str) -> None:
        """The engine's own state (the epoch's logged sums and Metric states on rank 0: they
        are every rank's; the callbacks' states), then the callbacks' and the module's
        on_load_checkpoint with what they added and the step it saved (`source`: the
        checkpoint, named where its state is damaged)."""
        state = dict(state)
        engine = state.pop(ENGINE_KEY, None)
        if engine is not None:  # (checkpoints of issue 54's first part have none)
            self._restore_engine_state(engine, source)
        checkpoint = {**state, "global_step": self.position.steps,
                      "epoch": self.trainer_view.current_epoch}
        for callback in self.listeners.get("on_load_checkpoint", ()):
            self._callback(callback, "on_load_checkpoint", checkpoint)
        self.module.on_load_checkpoint(checkpoint)

    def _restore_engine_state(self, engine, source: str) -> None:
        damaged = ConfigError(f"{source}: hpctrain's state of the module is damaged; it is "
                              "written by hpctrain: resume from an earlier checkpoint")
        sums = engine.get("epoch_sums") if isinstance(engine, dict) else None
        callbacks = engine.get("callbacks", {}) if isinstance(engine, dict) else None
        if not (isinstance(sums, torch.Tensor) and sums.shape == self.epoch_sums.shape
                and isinstance(callbacks, dict)):
            raise damaged
        leader = self.position.rank == 0  # (the sums and states are every rank's)
        self.logs.restore(engine.get("slots"), source)
        if leader:
            restore_metric_states(self.module, engine.get("metrics", {}), source)
        self.epoch_sums.copy_(sums if leader else torch.zeros_like(sums))
        for callback in self.callbacks:
            if callback.state_key in callbacks:  # (a callback added since starts afresh)
                try:
                    callback.load_state_dict(callbacks[callback.state_key])
                except (KeyError, TypeError, ValueError, AttributeError):
                    raise damaged from None

    def batch_hooks(self, optimizer) -> dict:
        """The module's hooks at a training batch's moments, as train/step.BatchHooks takes
        them, in Lightning's order."""
        return dict(
            before_zero_grad=lambda: self.hook("on_before_zero_grad", optimizer),
            before_backward=lambda loss: self.hook("on_before_backward", loss),
            after_backward=lambda: self.hook("on_after_backward"),
            before_optimizer_step=lambda: self.hook("on_before_optimizer_step", optimizer),
            batch_end=lambda: self.hook("on_train_batch_end", *self.last))


def _one_process(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


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
    logged sums as the step and its hooks gave them, read under Lightning's names at the
    interval, the evaluation and the epoch's end; `evaluates`: the module has a
    validation_step."""
    def to_device(batch, training: bool) -> Batch:
        batch = tensors.each(batch, lambda value: value.to(device, non_blocking=True)
                             if isinstance(value, torch.Tensor) else value)
        rows = batch_rows(batch)
        return WholeBatch({"batch": batch, "rows": rows}, None, torch.empty(rows))

    def loss(outputs, batch: Batch) -> torch.Tensor:
        return outputs.loss if isinstance(outputs, StepOutput) else outputs.new_zeros(())

    def sums(outputs, batch: Batch, loss, training: bool) -> torch.Tensor:
        return step.step_logged(outputs) if isinstance(outputs, StepOutput) else \
            outputs.sum(0)

    return Task(name, unit, SUM_NAMES, None, to_device, loss, sums,
                lambda read: {**step.logs.values(read, INTERVAL), **step.lr_seen},
                moment=step.at,
                evaluates=evaluates,
                eval_values=lambda read: step.logs.values(read, EVALUATION),
                after_step=step.after_step, epoch_figures=step.take_epoch_figures,
                stop_asked=step.stop_asked)


@dataclasses.dataclass
class WholeBatch(Batch):
    """A batch the module's step took whole. Its `labels` only count its rows (an empty
    tensor of that length: the engine counts samples by them); `first` keeps fewer rows,
    as evaluation leaves out the sampler's repeats by cutting the step's output, a share
    of what the batch logged per sample."""

    def first(self, rows: int) -> Batch:
        return WholeBatch(self.inputs, None, self.labels[:rows])
