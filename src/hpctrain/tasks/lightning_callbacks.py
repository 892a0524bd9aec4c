"""Lightning callbacks on hpctrain's engine (`lightning.callbacks`, `hpctrain.fit(callbacks=)`
and the module's `configure_callbacks`): run as they are, translated, or refused by name.

- Lightning's `EarlyStopping` and your own `Callback` subclasses run as they are: each hook at
  the module's moment, before the module's own, as Lightning calls them (a monitoring
  callback's `on_train_epoch_end` after the module's and after the epoch's figures are read,
  Lightning's one exception), `trainer` being the engine's view (lightning_trainer.EngineView).
  A callback that sets `trainer.should_stop` ends the run after that step as completed, its
  reason in the summary.
- `ModelCheckpoint` is translated (`KeepBest`): hpctrain's own checkpoints, which a resume
  reads, keep its `save_top_k` best by its `monitor` and `mode` besides the last ones; its
  `dirpath` and `filename` are not used (the banner says so).
- `LearningRateMonitor` is translated (`LrNames`): the train records gain its names.
- Lightning's other callbacks need the Trainer's own machinery: refused, naming them.
Lightning is not imported here: its callbacks are recognised by their classes' names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain import user_code
from hpctrain.errors import ConfigError
from hpctrain.tasks.lightning import LIGHTNING_PACKAGES, overrides

KEY = "lightning.callbacks"
# the callback hooks the engine calls (Lightning's Callback's, fitting's); the others a
# callback overrides are refused
CALLED = ("setup", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end",
          "on_train_epoch_start", "on_train_epoch_end", "on_validation_start",
          "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
          "on_train_batch_start", "on_train_batch_end", "on_validation_batch_start",
          "on_validation_batch_end", "on_before_backward", "on_after_backward",
          "on_before_optimizer_step", "on_before_zero_grad", "state_dict", "load_state_dict",
          "on_save_checkpoint", "on_load_checkpoint")
RUN_AS_THEY_ARE = ("EarlyStopping",)  # Lightning's own, whose hooks need only the view
WHY_NOT = {  # Lightning's callbacks the engine does not honour, and why
    "progress": "hpctrain prints its own progress line",
    "summary": "hpctrain's banner names the model and its parameters",
    "default": "it drives Lightning's Trainer machinery, which hpctrain's engine replaces",
}


@dataclass(frozen=True)
class KeepBest:
    """ModelCheckpoint's choice: the `top_k` best checkpoints by `monitor` (-1: all)."""

    monitor: str
    mode: str  # min | max
    top_k: int

    def ranked(self, kept: list, step: int, value: float) -> list:
        """`kept` ([step, value] pairs, in the order saved) with the checkpoint of `step`
        if it is among the best, as ModelCheckpoint ranks: kept while fewer than top_k,
        else replacing the worst one kept when strictly better."""
        if self.top_k < 0 or len(kept) < self.top_k:
            return [*kept, [step, value]]
        worst = (max if self.mode == "min" else min)(kept, key=lambda pair: pair[1])
        better = value < worst[1] if self.mode == "min" else value > worst[1]
        return [pair for pair in kept if pair is not worst] + [[step, value]] if better \
            else kept


@dataclass(frozen=True)
class LrNames:
    """LearningRateMonitor's names for the optimiser's settings in the train records."""

    momentum: bool = False
    weight_decay: bool = False


def lr_figures(optimizer, configs: list, names: LrNames) -> dict[str, float]:
    """LearningRateMonitor's figures of the optimiser's groups: `lr-SGD` (a scheduler's
    `name` where it has one; `-1`, `-2` for further unnamed ones), `/pgN` (or the group's
    `name`) where there are several groups, `-momentum` and `-weight_decay` when asked."""
    figures, unnamed = {}, 0
    for name in [config.name for config in configs] or [None]:
        if name is None:
            unnamed += 1
            name = f"lr-{type(optimizer).__name__}" + (f"-{unnamed - 1}" if unnamed > 1 else "")
        groups = optimizer.param_groups
        for index, group in enumerate(groups):
            label = group.get("name", f"pg{index + 1}") if len(groups) > 1 else group.get("name")
            suffix = f"/{label}" if label else ""
            figures[name + suffix] = group["lr"]
            if names.momentum:
                figures[f"{name}-momentum{suffix}"] = group["betas"][0] if "betas" in group \
                    else group.get("momentum", 0)
            if names.weight_decay:
                figures[f"{name}-weight_decay{suffix}"] = group["weight_decay"]
    return figures


@dataclass
class Callbacks:
    """The callbacks of a run, sorted by what the engine does with them."""

    run: list = field(default_factory=list)  # called as they are, in the order given
    keep_best: KeepBest | None = None
    lr_names: LrNames | None = None
    notes: list[str] = field(default_factory=list)  # the banner's words

    def by_hook(self) -> dict[str, list]:
        """Hook -> the callbacks run as they are that define it, in order (at
        on_train_epoch_end, those Lightning calls before the module)."""
        return {hook: self.listening(hook) for hook in CALLED}

    def lr_reader(self):
        """LearningRateMonitor's reading, `reader(optimizer, scheduler_configs)`, or None."""
        return None if self.lr_names is None else \
            lambda optimizer, configs: lr_figures(optimizer, configs, self.lr_names)

    def listening(self, hook: str, monitoring: bool = False) -> list:
        """The callbacks run as they are that define `hook`, in order; `monitoring`: only
        those Lightning calls after the module (else the others) at on_train_epoch_end."""
        return [callback for callback in self.run if hook in hooks_of(callback) and (
            hook != "on_train_epoch_end" or is_monitoring(callback) == monitoring)]


def hooks_of(callback) -> set[str]:
    """The hooks (of CALLED) the callback's class defines, rather than Callback's no-ops."""
    return {hook for hook in CALLED for base in type(callback).__mro__
            if hook in vars(base) and not (base.__name__ == "Callback" and
                                          base.__module__.startswith(LIGHTNING_PACKAGES))}


def _lightnings(callback) -> bool:
    return type(callback).__module__.startswith(LIGHTNING_PACKAGES)


def _is_callback(value) -> bool:
    return any(base.__name__ == "Callback" and base.__module__.startswith(LIGHTNING_PACKAGES)
               for base in type(value).__mro__)


def made(config) -> list:
    """The recipe's callbacks, each its class (or factory) called with its kwargs."""
    callbacks = []
    for index, spec in enumerate(config.lightning.callbacks):
        what = f"{KEY}[{index}]"
        factory = user_code.load(spec.name, what)
        callbacks.append(user_code.call_factory(factory, what, spec.name, {}, spec.kwargs))
    return callbacks


def with_modules(given: list, module) -> list:
    """The callbacks given, with the module's `configure_callbacks()` (if it has its own):
    one of those replaces a given one of the same class, as Lightning's Trainer does."""
    if not overrides(type(module), "configure_callbacks"):
        return list(given)
    own = module.configure_callbacks()
    own = list(own) if isinstance(own, (list, tuple)) else [own]
    kinds = {type(callback) for callback in own}
    return [callback for callback in given if type(callback) not in kinds] + own


def sorted_out(callbacks: list, epoch_end_saves: tuple[int, str] | None = None) -> Callbacks:
    """What the engine does with each callback, or a ConfigError naming one it cannot
    honour (what, why, what to do). `epoch_end_saves`: how many of the run's saves fall at an
    epoch's end, where a ModelCheckpoint ranks them, and the setting that says so."""
    out = Callbacks()
    for index, callback in enumerate(callbacks):
        name = type(callback).__name__
        if not _is_callback(callback):
            raise ConfigError(f"{KEY}[{index}]: a {name}, not a Lightning Callback "
                              "(lightning.pytorch.Callback or pytorch_lightning.Callback)")
        if not _lightnings(callback):
            _check_hooks(callback, index)
            out.run.append(callback)
        elif name in RUN_AS_THEY_ARE:
            out.run.append(callback)
        elif name == "ModelCheckpoint":
            out.keep_best = _keep_best(callback, out.keep_best)
            out.notes.append(_checkpoint_note(callback, out.keep_best, epoch_end_saves))
        elif name == "LearningRateMonitor":
            if callback.logging_interval == "epoch":
                raise ConfigError(f"{KEY}: LearningRateMonitor(logging_interval='epoch'): "
                                  "hpctrain records its figures at each logging interval "
                                  "(train.log_every steps); leave logging_interval out")
            out.lr_names = LrNames(callback.log_momentum, callback.log_weight_decay)
            out.notes.append("LearningRateMonitor: its figures (lr-OPTIMISER, per param "
                             "group /pgN) in each train record")
        else:
            kind = "progress" if "Progress" in name else "summary" if "Summary" in name \
                else "default"
            raise ConfigError(f"{KEY}: Lightning's {name} is not honoured by hpctrain's "
                              f"engine: {WHY_NOT[kind]}; leave it out (docs/lightning.md "
                              "lists the callbacks it takes)")
    return out


def _check_hooks(callback, index: int) -> None:
    """A ConfigError naming the hooks your callback overrides that the engine does not call
    (test and predict hooks aside: fitting does not call them)."""
    cls = type(callback)
    base = next(base for base in cls.__mro__ if base.__name__ == "Callback"
                and base.__module__.startswith(LIGHTNING_PACKAGES))
    own = {name for kind in cls.__mro__ if not kind.__module__.startswith(LIGHTNING_PACKAGES)
           for name in vars(kind)}
    refused = sorted(name for name in (set(vars(base)) & own) - set(CALLED)
                     if not name.startswith("_") and "test" not in name
                     and "predict" not in name)
    if refused:
        raise ConfigError(f"{KEY}[{index}]: {cls.__name__} overrides {', '.join(refused)}, "
                          "which hpctrain's engine does not call (docs/lightning.md lists "
                          "what it calls)")


def is_monitoring(callback) -> bool:
    """Whether Lightning calls its on_train_epoch_end after the module's (an EarlyStopping or
    a checkpoint callback, yours deriving from them too)."""
    return any(base.__name__ in ("EarlyStopping", "Checkpoint") and
               base.__module__.startswith(LIGHTNING_PACKAGES) for base in type(callback).__mro__)


def _keep_best(callback, kept: KeepBest | None) -> KeepBest | None:
    if kept is not None:
        raise ConfigError(f"{KEY}: two ModelCheckpoint callbacks: hpctrain keeps one set of "
                          "checkpoints, the best by one figure; give one")
    timing = {"every_n_train_steps": (getattr(callback, "_every_n_train_steps", 0), (0, None)),
              "train_time_interval": (getattr(callback, "_train_time_interval", None), (None,)),
              "every_n_epochs": (getattr(callback, "_every_n_epochs", 1), (1, None))}
    told = next((f"{name}={value!r}" for name, (value, plain) in timing.items()
                 if value not in plain), None)  # (the first: the others follow from it)
    if told:
        raise ConfigError(f"{KEY}: ModelCheckpoint({told}): hpctrain ranks its "
                          "checkpoints at each epoch's end, as ModelCheckpoint does by default; "
                          "leave it out (checkpoint.every_steps sets when hpctrain saves)")
    if callback.monitor is None or callback.save_top_k == 0:
        return None  # the last checkpoints only: hpctrain's own checkpoint.keep_last
    return KeepBest(callback.monitor, callback.mode, callback.save_top_k)


def _checkpoint_note(callback, kept: KeepBest | None,
                     epoch_end_saves: tuple[int, str] | None) -> str:
    """The banner's words for a ModelCheckpoint: what is kept, and how many checkpoints this
    run has to rank where it saves at fewer epoch ends than the best it keeps."""
    unused = [name for name, value in (("dirpath", callback.dirpath),
                                       ("filename", callback.filename)) if value]
    what = ("its last checkpoints (checkpoint.keep_last)" if kept is None else
            f"the {'all' if kept.top_k < 0 else kept.top_k} best by {kept.monitor} "
            f"({kept.mode}) besides the last ones (checkpoint.keep_last)")
    if kept is not None and epoch_end_saves is not None and \
            (kept.top_k < 0 or epoch_end_saves[0] < kept.top_k):
        saves, setting = epoch_end_saves
        what += (f", of the {saves} checkpoint{'s' if saves != 1 else ''} this run saves at an "
                 f"epoch's end ({setting})" if saves else
                 f"; but none of this run's checkpoints falls at an epoch's end ({setting}): "
                 "only the last ones are kept")
    return (f"ModelCheckpoint: hpctrain's checkpoints, which a resume reads, keep {what}"
            + (f"; its {' and '.join(unused)} are not used: they are in the run's "
               "checkpoints/ folder" if unused else ""))
