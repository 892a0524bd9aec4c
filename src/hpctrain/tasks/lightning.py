"""A LightningModule trained on hpctrain's engine: its own steps, logs and optimiser.

The module is the task: `training_step` gives the loss, `self.log`/`self.log_dict` in
`training_step` and `validation_step` give the figures, `configure_optimizers` the optimiser
and LR schedule (tasks/lightning_optim.py). The engine's loop, DDP/FSDP, precision,
checkpoints, preemption and telemetry stay hpctrain's: the module runs behind an adapter
(`lightning_step.py`) whose forward calls the step, so the data-parallel wrappers see the
module's parameters used as in any forward. Batches reach the module as the dataset and the
default collation made them, on the device, as Lightning's DataLoader would give them.

What the engine does not call is refused before training, named: a hook the module overrides
(`on_train_epoch_end`, `optimizer_step`, ...) and manual optimisation. Test and predict
hooks are not part of fitting and are left alone, as Lightning's `fit` leaves them.

Lightning is never imported here: a module is recognised by its classes' names, so a recipe
is read without it (`spec.py`), from `lightning.pytorch` or `pytorch_lightning` alike.
Here: a LightningModule recognised, the hooks it may override, and its adapter made; the
task's spec is lightning_task.py.
"""

from __future__ import annotations

import weakref

from hpctrain import user_code
from hpctrain.errors import ConfigError

NAME = "lightning"  # the task (lightning_task.py), named in what this module refuses
LIGHTNING_PACKAGES = ("lightning.pytorch.", "pytorch_lightning.")
# the module's hooks at each of the loop's moments (Task.moment), in Lightning's order:
# validation inside the epoch, then on_train_epoch_end
HOOKS = {"train_start": ("on_fit_start", "on_train_start"),
         "train_epoch_start": ("on_train_epoch_start",),
         "validation_start": ("on_validation_start", "on_validation_epoch_start"),
         "validation_end": ("on_validation_epoch_end", "on_validation_end"),
         "train_epoch_end": ("on_train_epoch_end",),
         "train_end": ("on_train_end", "on_fit_end")}
# a training batch's hooks and a validation batch's, at Lightning's moments (the engine's
# step: train/step.BatchHooks; lightning_step.LightningStep.forward)
BATCH_HOOKS = ("on_train_batch_start", "on_before_zero_grad", "on_before_backward",
               "on_after_backward", "on_before_optimizer_step", "on_train_batch_end",
               "on_validation_batch_start", "on_validation_batch_end")
# what the engine calls, besides forward (which the steps call themselves); a module's own
# loaders when hpctrain.fit is given no data (as Lightning's Trainer.fit)
LOADER_HOOKS = ("prepare_data", "train_dataloader", "val_dataloader")
CALLED = ("training_step", "validation_step", "configure_optimizers", "setup",
          "configure_model", "on_save_checkpoint", "on_load_checkpoint", "configure_callbacks",
          *LOADER_HOOKS,
          *BATCH_HOOKS,
          *(hook for hooks in HOOKS.values() for hook in hooks))
_SET_UP: weakref.WeakSet = weakref.WeakSet()  # modules whose setup("fit") has run
_PREPARED: weakref.WeakSet = weakref.WeakSet()  # modules whose prepare_data has run
# the LightningModule's own methods that are hooks (besides those of its hook classes)
MODULE_HOOKS = ("optimizer_step", "optimizer_zero_grad", "lr_scheduler_step", "backward",
                "configure_gradient_clipping")
HOOK_CLASSES = ("ModelHooks", "DataHooks", "CheckpointHooks")


def _lightning_classes(cls: type) -> list[type]:
    return [base for base in cls.__mro__
            if base.__module__.startswith(LIGHTNING_PACKAGES)]


def _framework(cls: type) -> list[type]:
    """Lightning's own classes in `cls`'s MRO: LightningModule (or LightningDataModule) and
    its bases. A module's own classes come before, whatever package defines them: Lightning's
    demos (BoringModel) are modules like any user's, their hooks called or refused alike."""
    for index, base in enumerate(cls.__mro__):
        if base.__name__ in ("LightningModule", "LightningDataModule") and \
                base.__module__.startswith(LIGHTNING_PACKAGES):
            return list(cls.__mro__[index:])
    return []


def is_lightning_class(cls) -> bool:
    """Whether `cls` is a LightningModule subclass (of either package)."""
    return isinstance(cls, type) and any(
        base.__name__ == "LightningModule" for base in _lightning_classes(cls))


def is_lightning_module(value) -> bool:
    return is_lightning_class(type(value))


def is_data_module(value) -> bool:
    """Whether `value` is a LightningDataModule (of either package)."""
    return any(base.__name__ == "LightningDataModule"
               for base in _lightning_classes(type(value)))


def names_lightning_class(reference: str) -> bool:
    """Whether the recipe's model.name is a LightningModule class (importing its module);
    False for a factory, hpctrain's or a library's model, or code that does not import."""
    if not user_code.is_code_reference(reference):
        return False
    try:
        return is_lightning_class(user_code.load(reference, "model.name"))
    except ConfigError:  # said again, whole, where the model is built
        return False


def overrides(cls: type, name: str) -> bool:
    """Whether `cls` (a LightningModule or LightningDataModule class) defines `name` itself,
    rather than inheriting Lightning's."""
    owner = next((base for base in cls.__mro__ if name in vars(base)), None)
    return owner is not None and owner not in _framework(cls)


def own_loaders(module, leader: bool) -> tuple:
    """A LightningModule's own (train_dataloader(), val_dataloader()), after its
    prepare_data() (`leader`: this process is its node's first) and setup("fit"), as
    Lightning's Trainer.fit calls them (each once: the engine does not call them again). A
    module without validation_step needs no val_dataloader: its training set stands in, never
    read."""
    validates = overrides(type(module), "validation_step")
    missing = [hook for hook in LOADER_HOOKS[1:] if not overrides(type(module), hook)
               and (validates or hook == "train_dataloader")]
    if missing:
        raise ConfigError(f"fit({type(module).__name__}) with no data: the module has no "
                          f"{' nor '.join(missing)} of its own; give train_data and val_data "
                          "(Datasets, DataLoaders or a LightningDataModule)")
    prepare_once(module, leader)
    _set_up(module)
    train = module.train_dataloader()
    return train, module.val_dataloader() if validates else train.dataset


def prepare_once(module, leader: bool) -> None:
    """The module's prepare_data (its downloads), once per node before its setup, as
    Lightning's default (prepare_data_per_node): on the node's first process (`leader`),
    which the others wait for."""
    if is_lightning_module(module) and module not in _PREPARED:  # (adapt refuses others)
        if leader:
            module.prepare_data()
        _PREPARED.add(module)


def _set_up(module) -> None:
    if module not in _SET_UP:
        module.setup("fit")
        _SET_UP.add(module)


def refused_hooks(cls: type) -> list[str]:
    """The hooks `cls` overrides that hpctrain's engine does not call (test and predict
    hooks aside: fitting does not call them)."""
    framework = _framework(cls)
    hooks = {name for base in framework if base.__name__ in HOOK_CLASSES
             for name in vars(base) if not name.startswith("_")} | set(MODULE_HOOKS)
    return sorted(name for name in hooks - set(CALLED)
                  if "test" not in name and "predict" not in name and overrides(cls, name))


def adapt(module, device):
    """The module the engine steps (lightning_step.LightningStep, on `device`), after its
    own setup hooks; a module that needs what the engine does not call is refused, naming
    it."""
    if not is_lightning_module(module):
        raise ConfigError(f"task {NAME}: the model is a {type(module).__name__}, not a "
                          "LightningModule; use task=auto for your own torch.nn.Module")
    refused = refused_hooks(type(module))
    if refused:
        raise ConfigError(f"{type(module).__name__} overrides {', '.join(refused)}, which "
                          "hpctrain's engine does not call (docs/lightning.md lists what it "
                          "calls): move that work into the steps or the epoch hooks, or train "
                          "it with Lightning's Trainer")
    if not module.automatic_optimization:
        raise ConfigError(f"{type(module).__name__} sets automatic_optimization = False: "
                          "manual optimisation is not supported by hpctrain's engine, which "
                          "steps the optimiser configure_optimizers returns; return the loss "
                          "from training_step and let the engine step (clipping: "
                          "optim.grad_clip_norm), or train it with Lightning's Trainer")
    from hpctrain.tasks.lightning_step import LightningStep

    step = LightningStep(module, device, HOOKS, frozenset(  # its answers, before its setup
        hook for hook in BATCH_HOOKS if overrides(type(module), hook)))
    _set_up(module)
    module.configure_model()
    return step
