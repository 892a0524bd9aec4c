"""A LightningModule's optimiser and LR schedules, from its `configure_optimizers`.

Its documented return forms: an optimiser; a list or tuple of one; `(optimisers,
schedulers)`; or a dict with "optimizer" and "lr_scheduler", each scheduler a scheduler or
a config dict ({"scheduler", "interval": "step" | "epoch", "frequency"}). One optimiser only
(several are stepped by manual optimisation, which the engine does not do); a scheduler
stepped on a monitored figure (ReduceLROnPlateau, "monitor") is refused for now: Lightning
steps it after the epoch's validation, and the engine's schedule steps at the optimiser's.

`LightningSchedules` is the engine's schedule for such a module: the loop calls `step()`
after every optimiser step, and it steps each of the module's schedulers at its interval,
as Lightning's Trainer does (interval "epoch": after the epoch's last step). Its state, in
the checkpoint's meta.json, is the engine's step count and the schedulers' own states.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from hpctrain.errors import ConfigError
from hpctrain.tasks.lightning_step import LightningStep, Position

INTERVALS = ("step", "epoch")


@dataclass
class Scheduled:
    scheduler: object  # torch.optim.lr_scheduler.LRScheduler
    interval: str
    frequency: int


def from_module(step: LightningStep) -> tuple[torch.optim.Optimizer, LightningSchedules]:
    """The optimiser and schedules `step.module.configure_optimizers()` returns, checked."""
    name = type(step.module).__name__
    returned = step.module.configure_optimizers()
    optimizers, schedulers = _parts(returned, name)
    if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
        raise ConfigError(
            f"{name}.configure_optimizers returned {_what(optimizers)}: hpctrain's engine "
            "steps one torch.optim.Optimizer (several are stepped by manual optimisation, "
            "which it does not do)")
    scheduled = [_scheduled(entry, name, optimizers[0]) for entry in schedulers]
    return optimizers[0], LightningSchedules(optimizers[0], scheduled, step.position)


def _what(value) -> str:
    if isinstance(value, (list, tuple)):
        return f"{len(value)} optimisers" if len(value) != 1 else f"a {type(value[0]).__name__}"
    return "None" if value is None else f"a {type(value).__name__}"


def _parts(returned, name: str) -> tuple[list, list]:
    """(optimisers, schedulers) of the documented return forms."""
    if isinstance(returned, dict):
        unknown = set(returned) - {"optimizer", "lr_scheduler", "monitor"}
        if "optimizer" not in returned or unknown:
            raise ConfigError(f"{name}.configure_optimizers returned a dict with keys "
                              f"{sorted(returned)}: expected 'optimizer' and optionally "
                              "'lr_scheduler'")
        if "monitor" in returned:
            raise _monitored(name)
        scheduler = returned.get("lr_scheduler")
        return [returned["optimizer"]], [] if scheduler is None else [scheduler]
    if isinstance(returned, (list, tuple)) and len(returned) == 2 and \
            all(isinstance(part, (list, tuple)) for part in returned):
        return list(returned[0]), list(returned[1])
    if isinstance(returned, (list, tuple)):
        if any(isinstance(part, dict) for part in returned):
            raise ConfigError(f"{name}.configure_optimizers returned several dicts: hpctrain's "
                              "engine steps one optimiser")
        return list(returned), []
    return [returned], []


def _monitored(name: str) -> ConfigError:
    return ConfigError(f"{name}.configure_optimizers: a scheduler stepped on a monitored "
                       "figure ('monitor', ReduceLROnPlateau) is not supported by hpctrain's "
                       "engine yet; use a schedule of the step or epoch (StepLR, "
                       "CosineAnnealingLR, OneCycleLR, LambdaLR, ...)")


def _scheduled(entry, name: str, optimizer) -> Scheduled:
    config = dict(entry) if isinstance(entry, dict) else {"scheduler": entry}
    scheduler = config.get("scheduler")
    interval, frequency = config.get("interval", "epoch"), config.get("frequency", 1)
    if "monitor" in config or isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise _monitored(name)
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
    return Scheduled(scheduler, interval, frequency)


class LightningSchedules:
    """The engine's LR schedule for a LightningModule: its schedulers, each at its
    interval, and the engine's position (global_step) advanced with every step."""

    def __init__(self, optimizer, scheduled: list[Scheduled], position: Position):
        self.optimizer, self.scheduled, self.position = optimizer, scheduled, position

    def describe(self) -> str:
        lr = self.optimizer.param_groups[0]["lr"]
        said = ", ".join(f"{type(s.scheduler).__name__} every {s.frequency} {s.interval}(s)"
                         for s in self.scheduled) or "no LR scheduler"
        return (f"{type(self.optimizer).__name__} lr {lr:.4g} and {said}, from "
                "configure_optimizers (optim.* and schedule.* are not used)")

    def step(self) -> None:
        position = self.position
        position.steps += 1
        position.micro = 0
        epoch_ended = position.steps % position.steps_per_epoch == 0
        for entry in self.scheduled:
            # Lightning's count: the batches of this epoch, or the epochs, so far
            count = ((position.steps - 1) % position.steps_per_epoch + 1) * \
                position.accumulate if entry.interval == "step" else \
                position.steps // position.steps_per_epoch
            if (entry.interval == "step" or epoch_ended) and count % entry.frequency == 0:
                entry.scheduler.step()

    def state_dict(self) -> dict:
        return {"last_epoch": self.position.steps,
                "schedulers": [entry.scheduler.state_dict() for entry in self.scheduled]}

    def restore(self, state: dict, settings: list[dict]) -> None:
        """A resume's position: the engine's step count and the schedulers' states, the
        optimiser's LRs as the schedulers last set them (`settings`: unused, the module's
        optimiser is its own)."""
        saved = state.get("schedulers")
        if not isinstance(saved, list) or len(saved) != len(self.scheduled):
            raise ConfigError(f"the checkpoint holds {len(saved or [])} LR scheduler state(s) "
                              f"and configure_optimizers returns {len(self.scheduled)}: resume "
                              "with the module that saved it")
        self.position.steps = state["last_epoch"]
        for entry, own in zip(self.scheduled, saved):
            entry.scheduler.load_state_dict(own)
            for group, lr in zip(self.optimizer.param_groups, entry.scheduler.get_last_lr()):
                group["lr"] = lr
