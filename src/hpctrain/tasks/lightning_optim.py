"""A LightningModule's optimiser and LR schedules, from its `configure_optimizers`.

Its documented return forms: an optimiser; a list or tuple of one; `(optimisers,
schedulers)`; or a dict with "optimizer", "lr_scheduler" and "monitor", each scheduler a
scheduler or a config dict ({"scheduler", "interval": "step" | "epoch", "frequency",
"monitor"}). One optimiser
only (several are stepped by manual optimisation, which the engine does not do). A scheduler
stepped on a monitored figure (ReduceLROnPlateau) steps at the epoch's end, after its
validation and on_train_epoch_end, on the figure's latest value, as Lightning steps it.

`LightningSchedules` is the engine's schedule for such a module: the loop calls `step()`
after every optimiser step, and it steps each of the module's schedulers at its interval,
as Lightning's Trainer does (interval "epoch": after the epoch's last step; a monitored one
at the epoch's end, `LightningStep.after`). Its state, in
the checkpoint's meta.json, is the engine's step count and the schedulers' own states.
"""

from __future__ import annotations

import json
import torch

from hpctrain.errors import ConfigError
from hpctrain.tasks.lightning_step import LightningStep
from hpctrain.tasks.lightning_trainer import Position, SchedulerConfig

INTERVALS = ("step", "epoch")


def from_module(step: LightningStep) -> tuple[torch.optim.Optimizer, LightningSchedules]:
    """The optimiser and schedules `step.module.configure_optimizers()` returns, checked."""
    name = type(step.module).__name__
    returned = step.module.configure_optimizers()
    optimizers, schedulers, monitor = _parts(returned, name)
    if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
        raise ConfigError(
            f"{name}.configure_optimizers returned {_what(optimizers)}: hpctrain's engine "
            "steps one torch.optim.Optimizer (several are stepped by manual optimisation, "
            "which it does not do); give one optimiser with a param group per part (each its "
            "own lr), or train a GAN-style module with Lightning's Trainer")
    scheduled = [_scheduled(entry, name, optimizers[0], monitor) for entry in schedulers]
    schedules = LightningSchedules(optimizers[0], scheduled, step.position, step.logs.latest)
    step.after["train_epoch_end"].append(schedules.epoch_ended)
    step.optimizer, step.scheduler_configs = optimizers[0], scheduled  # self.optimizers()
    return optimizers[0], schedules


def _what(value) -> str:
    if isinstance(value, (list, tuple)):
        return f"{len(value)} optimisers" if len(value) != 1 else f"a {type(value[0]).__name__}"
    return "None" if value is None else f"a {type(value).__name__}"


def _parts(returned, name: str) -> tuple[list, list, str | None]:
    """(optimisers, schedulers, the dict's monitor) of the documented return forms."""
    if isinstance(returned, dict):
        unknown = set(returned) - {"optimizer", "lr_scheduler", "monitor"}
        if "optimizer" not in returned or unknown:
            raise ConfigError(f"{name}.configure_optimizers returned a dict with keys "
                              f"{sorted(returned)}: expected 'optimizer' and optionally "
                              "'lr_scheduler' and 'monitor'")
        scheduler = returned.get("lr_scheduler")
        return [returned["optimizer"]], [] if scheduler is None else [scheduler], \
            returned.get("monitor")
    if isinstance(returned, (list, tuple)) and len(returned) == 2 and \
            all(isinstance(part, (list, tuple)) for part in returned):
        return list(returned[0]), list(returned[1]), None
    if isinstance(returned, (list, tuple)):
        if any(isinstance(part, dict) for part in returned):
            raise ConfigError(f"{name}.configure_optimizers returned several dicts: hpctrain's "
                              "engine steps one optimiser")
        return list(returned), [], None
    return [returned], [], None


def _scheduled(entry, name: str, optimizer, monitor: str | None) -> SchedulerConfig:
    config = dict(entry) if isinstance(entry, dict) else {"scheduler": entry}
    scheduler = config.get("scheduler")
    interval, frequency = config.get("interval", "epoch"), config.get("frequency", 1)
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    monitor = config.get("monitor", monitor) if plateau else None
    if plateau and (not isinstance(monitor, str) or interval != "epoch"):
        raise ConfigError(f"{name}.configure_optimizers: its ReduceLROnPlateau steps on a "
                          "figure it logs: give 'monitor' (the name logged, 'val_loss') with "
                          "the interval 'epoch'")
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise ConfigError(f"{name}.configure_optimizers: lr_scheduler is a "
                          f"{type(scheduler).__name__}, not a torch LR scheduler")
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise ConfigError(f"{name}.configure_optimizers: its {type(scheduler).__name__} "
                          "schedules another optimiser than the one returned")
    if interval not in INTERVALS or not isinstance(frequency, int) or frequency < 1:
        raise ConfigError(f"{name}.configure_optimizers: lr_scheduler interval "
                          f"{interval!r}, frequency {frequency!r}: expected an interval of "
                          f"{' or '.join(INTERVALS)} and a frequency of at least 1")
    try:
        json.dumps(scheduler.state_dict())
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{name}.configure_optimizers: the state of its "
                          f"{type(scheduler).__name__} cannot be saved in a checkpoint's "
                          f"meta.json ({err})") from None
    return SchedulerConfig(scheduler, interval, frequency, monitor, config.get("name"),
                           config.get("strict", True))


class LightningSchedules:
    """The engine's LR schedule for a LightningModule: its schedulers, each at its
    interval, and the engine's position (global_step) advanced with every step."""

    def __init__(self, optimizer, scheduled: list[SchedulerConfig], position: Position,
                 latest: dict[str, float | None]):
        self.optimizer, self.scheduled, self.position = optimizer, scheduled, position
        self.latest = latest  # the logged figures as last read (Logs.latest)

    def describe(self) -> str:
        lr = self.optimizer.param_groups[0]["lr"]
        said = ", ".join(f"{type(s.scheduler).__name__} every {s.frequency} {s.interval}(s)"
                         + (f" on {s.monitor}" if s.monitor else "")
                         for s in self.scheduled) or "no LR scheduler"
        return (f"{type(self.optimizer).__name__} lr {lr:.4g} and {said}, from "
                "configure_optimizers (optim.* and schedule.* are not used)")

    def step(self) -> None:
        position = self.position
        position.steps += 1
        position.micro = 0
        epoch_ended = position.steps % position.steps_per_epoch == 0
        for entry in self.scheduled:
            if entry.monitor is not None:
                continue  # at the epoch's end: epoch_ended
            # Lightning's count: the batches of this epoch, or the epochs, so far
            count = ((position.steps - 1) % position.steps_per_epoch + 1) * \
                position.accumulate if entry.interval == "step" else \
                position.steps // position.steps_per_epoch
            if (entry.interval == "step" or epoch_ended) and count % entry.frequency == 0:
                entry.scheduler.step()

    def epoch_ended(self) -> None:
        """The monitored schedulers at the end of an epoch (its validation and
        on_train_epoch_end done), on their figure's latest value."""
        epochs = self.position.steps // self.position.steps_per_epoch
        for entry in self.scheduled:
            if entry.monitor is None or epochs % entry.frequency:
                continue
            value = self.latest.get(entry.monitor)
            if value is None:
                raise ConfigError(
                    f"the ReduceLROnPlateau of configure_optimizers monitors "
                    f"{entry.monitor!r}, which has not been logged by the end of epoch "
                    f"{epochs - 1} (logged: {', '.join(self.latest) or 'nothing'})")
            entry.scheduler.step(value)

    def state_dict(self) -> dict:
        """The engine's step count, the schedulers' states and the optimiser's groups as the
        schedulers left them: a scheduler sets more than the LR (OneCycleLR and CyclicLR
        cycle SGD's momentum and Adam's first beta)."""
        return {"last_epoch": self.position.steps,
                "schedulers": [entry.scheduler.state_dict() for entry in self.scheduled],
                "groups": [scheduled_settings(group) for group in self.optimizer.param_groups]}

    def restore(self, state: dict, settings: list[dict]) -> None:
        """A resume's position: the engine's step count, the schedulers' states, and each
        group's settings as the checkpoint left them, as Lightning restores the optimiser's
        state whole (`settings`: unused, the module's optimiser is its own)."""
        saved = state.get("schedulers")
        if not isinstance(saved, list) or len(saved) != len(self.scheduled):
            raise ConfigError(f"the checkpoint holds {len(saved or [])} LR scheduler state(s) "
                              f"and configure_optimizers returns {len(self.scheduled)}: resume "
                              "with the module that saved it")
        self.position.steps = state["last_epoch"]
        for entry, own in zip(self.scheduled, saved):
            entry.scheduler.load_state_dict(own)
        groups = state.get("groups")
        if isinstance(groups, list) and len(groups) == len(self.optimizer.param_groups):
            for group, values in zip(self.optimizer.param_groups, groups):
                group.update({key: tuple(value) if isinstance(group.get(key), tuple) else value
                              for key, value in values.items() if key in group})
            return
        for entry in self.scheduled:  # checkpoints of earlier versions: the LRs alone
            for group, lr in zip(self.optimizer.param_groups, entry.scheduler.get_last_lr()):
                group["lr"] = lr


def scheduled_settings(group: dict) -> dict:
    """A param group's settings a schedule may change: its numbers and pairs of numbers
    (lr, momentum, betas, weight_decay, a cyclic schedule's bounds), as JSON keeps them."""
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in group.items() if key != "params" and (
                number(value) or (isinstance(value, tuple) and all(map(number, value))))}
