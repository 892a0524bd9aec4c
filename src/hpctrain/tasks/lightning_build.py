"""What a LightningModule changes in the engine's build (tasks/spec.OwnSteps, which
train/build.py asks): the adapter the engine steps, made after the module's prepare_data and
setup, and its own optimiser and schedules with its callbacks sorted out."""

from __future__ import annotations

from hpctrain.tasks import lightning, lightning_callbacks
from hpctrain.tasks.lightning_optim import LightningSchedules, from_module
from hpctrain.tasks.lightning_step import LightningStep
from hpctrain.tasks.lightning_trainer import Position


def adapted(module, device, distributed, data) -> LightningStep:
    """The module behind its adapter on `device`: its prepare_data once a node (its
    downloads, before any setup), its epoch figures reduced over `distributed`'s ranks,
    `self.trainer.datamodule` the data's."""
    with distributed.node_leader_first():
        lightning.prepare_once(module, distributed.env.local_rank == 0)
    step = lightning.adapt(module, device)
    step.reduce = distributed.sum_
    step.datamodule = data.data_module
    return step


def own_optimizer(step: LightningStep, config, position: dict) \
        -> tuple[object, LightningSchedules]:
    """Its configure_optimizers' optimiser and schedules, once `self.trainer` knows the run
    (`position`: lightning_trainer.Position's fields), and the recipe's callbacks with the
    module's own, sorted (set up once its view knows them all)."""
    step.position = Position(**position)
    optimizer, schedules = from_module(step)
    step.add_callbacks(lightning_callbacks.sorted_out(lightning_callbacks.with_modules(
        lightning_callbacks.made(config), step.module), _epoch_end_saves(config, step.position)))
    return optimizer, schedules


def _epoch_end_saves(config, position: Position) -> tuple[int, str] | None:
    """(how many of the run's saves fall at an epoch's end, where a ModelCheckpoint ranks
    them; the setting that says when it saves), or None where checkpoint.every=auto's pacer
    decides as the run goes."""
    checkpoint = config.checkpoint
    if checkpoint.every == "auto":
        return None
    every, epoch, total = (checkpoint.steps_between(position.steps_per_epoch),
                           position.steps_per_epoch, position.total_steps)
    saves = sum(1 for end in range(epoch, total + 1, epoch) if end % every == 0 or end == total)
    setting = f"checkpoint.every_steps={checkpoint.every_steps}" if checkpoint.every_steps \
        else f"checkpoint.every_epochs={checkpoint.every_epochs:g}"
    return saves, setting
