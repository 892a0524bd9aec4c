"""What a LightningModule logs (`self.log`, `self.log_dict`) on hpctrain's engine, named and
reduced as Lightning names and reduces it.

Each (stage, name) has a slot in a device vector of CAPACITY slots: the weighted sum and the
weight of what was logged there, weighted by the batch's size as Lightning's
`reduce_fx="mean"` is (`"sum"`: summed). Nothing is read back in the step: the engine sums
the vectors over micro-steps and ranks and reads them at three moments (`READS`):
- `interval`: a training figure logged on_step, its mean over the logging interval
  (Lightning logs the last step's);
- `epoch`: a training figure logged on_epoch, its mean over the epoch, read at the epoch's
  end after on_train_epoch_end (Lightning's `name_epoch`);
- `evaluation`: a validation figure, its mean over the validation set.
A figure logged both on_step and on_epoch is recorded as `name_step` and `name_epoch`, as
Lightning records it; on_step and on_epoch default as Lightning's do in each hook (`where`).
Every read sums over all ranks, as Lightning's `sync_dist=True` does (hpctrain never records
one rank's figure for all). A torchmetrics Metric logged is computed (and reset) when read; one
logged on_step and on_epoch gives the mean of its batch values (its forward's) as `name_step`
and its compute() over the epoch as `name_epoch`, as Lightning gives them.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass

import torch
from torch import nn

from hpctrain.errors import ConfigError

CAPACITY = 32  # (stage, name) slots a module may log into in one run
SUM_NAMES = tuple(f"{slot}:{part}" for slot in range(CAPACITY) for part in ("sum", "weight"))
REDUCTIONS = ("mean", "sum")
METRIC = "metric"  # a torchmetrics Metric logged: its compute() over what it gathered
TRAIN, VAL = "train", "val"
INTERVAL, EPOCH, EVALUATION = READS = ("interval", "epoch", "evaluation")
# hooks that log once per epoch (Lightning allows only on_epoch there)
EPOCH_HOOKS = ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_epoch_end",
               "on_validation_start", "on_validation_epoch_start", "on_validation_epoch_end",
               "on_validation_end")
# the record's own keys in metrics.jsonl, which a logged figure may not replace; `lr` may be
# logged (a common idiom, which Lightning keeps): the figure logged is the record's `lr` then
RESERVED = ("step", "kind", "time", "epoch", "samples_per_second", "data_wait_fraction",
            "eval_seconds", "elapsed_seconds", "device_hours", "energy_joules")


@dataclass(frozen=True)
class Where:
    """Where the module is logging: its hook, the stage the figures belong to, Lightning's
    on_step/on_epoch defaults there, and whether on_step is allowed."""

    hook: str
    stage: str
    on_step: bool
    on_epoch: bool
    steps: bool = True


def where(hook: str) -> Where:
    """Lightning's logging defaults in `hook`: training_step and a training batch's hooks
    log on_step, validation_step and a validation batch's hooks on_epoch, epoch hooks only
    on_epoch."""
    stage = VAL if "validation" in hook else TRAIN
    if hook in EPOCH_HOOKS:
        return Where(hook, stage, False, True, steps=False)
    return Where(hook, stage, stage == TRAIN, stage == VAL)


@dataclass(frozen=True)
class Slot:
    """One logged figure: its stage and name, its reduction, when it is read."""

    stage: str
    name: str
    reduction: str
    on_step: bool
    on_epoch: bool

    @property
    def forked(self) -> bool:
        return self.on_step and self.on_epoch

    def read_at(self, read: str) -> bool:
        if self.stage == VAL:
            return read == EVALUATION
        return self.on_step if read == INTERVAL else self.on_epoch and read == EPOCH

    def named(self, read: str) -> str:
        """Its name in the records: Lightning's `name_step`/`name_epoch` when forked."""
        if not self.forked:
            return self.name
        return f"{self.name}_step" if read == INTERVAL else f"{self.name}_epoch"


class Logs:
    """The figures a module logged, by slot, and what one step (or hook) logged."""

    def __init__(self, device: torch.device):
        self.device = device
        self.slots: list[Slot] = []
        self.where = where("training_step")
        self.rows: int | None = None  # the batch size the logged values weigh by
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

    def add(self, name: str, value, prog_bar: bool = False, logger=None,
            on_step: bool | None = None, on_epoch: bool | None = None,
            reduce_fx="mean", batch_size: int | None = None, **ignored) -> None:
        """One `self.log` call (prog_bar, logger, sync_dist and the rest: the engine records
        every figure, summed over all ranks)."""
        if self.pending is None:
            raise ConfigError(f"self.log({name!r}, ...) outside the steps and the epoch "
                              "hooks (in on_train_end or on_fit_end, or in configure_"
                              "optimizers): hpctrain's engine records what those log")
        here = self.where
        on_step = here.on_step if on_step is None else bool(on_step)
        on_epoch = here.on_epoch if on_epoch is None else bool(on_epoch)
        if on_step and not here.steps:
            raise ConfigError(f"self.log({name!r}, ..., on_step=True) in {here.hook}: an "
                              "epoch hook logs once an epoch (on_epoch=True), as Lightning "
                              "allows there")
        if not (on_step or on_epoch):
            return  # recorded nowhere, as under Lightning
        if _is_metric(value):
            self._add_metric(name, value, on_step, on_epoch)
            return
        if reduce_fx not in REDUCTIONS:
            raise ConfigError(f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): hpctrain's "
                              f"engine reduces by {' or '.join(REDUCTIONS)}")
        slot = self._slot(name, reduce_fx, on_step, on_epoch)
        number = value if _is_real(value) else _number(name, value).to(self.device,
                                                                          torch.float64)
        self._add(slot, number, 1 if reduce_fx == "sum" else (batch_size or self.rows))

    def _add(self, slot: int, number, weight) -> None:
        self.pending[2 * slot] += number * weight
        self.pending[2 * slot + 1] += weight

    def _add_metric(self, name: str, metric, on_step: bool, on_epoch: bool) -> None:
        """A Metric counted in this read's window, computed when read; logged on_step and
        on_epoch in training, its batch value (forward's) also averaged for `name_step`."""
        slot = self._slot(name, METRIC, on_step, on_epoch)
        self.metrics[slot] = metric
        if not (self.slots[slot].forked and self.where.stage == TRAIN):
            self.pending[2 * slot + 1] += 1
            return
        batch_value = getattr(metric, "_forward_cache", None)
        if not isinstance(batch_value, torch.Tensor):
            raise ConfigError(
                f"self.log({name!r}, <{type(metric).__name__}>, on_step=True, on_epoch=True)"
                " after its update() alone: the step's value is the batch's, which calling "
                f"the metric gives ({name} = metric(preds, target)); call it, or log "
                "on_epoch only")
        self._add(slot, _number(name, batch_value).to(self.device, torch.float64), self.rows)

    def add_dict(self, dictionary, **options) -> None:
        for name, value in dict(dictionary).items():
            self.add(name, value, **options)

    def _slot(self, name: str, reduction: str, on_step: bool, on_epoch: bool) -> int:
        stage = self.where.stage
        for index, slot in enumerate(self.slots):
            if (slot.stage, slot.name) == (stage, name):
                if (slot.on_step, slot.on_epoch) != (on_step, on_epoch):
                    raise ConfigError(
                        f"self.log({name!r}, ..., on_step={on_step}, on_epoch={on_epoch}) in "
                        f"{self.where.hook}: it was logged in {stage} with on_step="
                        f"{slot.on_step}, on_epoch={slot.on_epoch}; a name is recorded one "
                        "way: log the other under another name")
                return index
        if not isinstance(name, str) or not name:
            raise ConfigError(f"self.log({name!r}, ...): the name is a non-empty string")
        if name in RESERVED:
            raise ConfigError(f"self.log({name!r}, ...): hpctrain records {name!r} itself in "
                              f"metrics.jsonl; log it under another name")
        if len(self.slots) == CAPACITY:
            raise ConfigError(f"self.log({name!r}, ...): a run logs at most {CAPACITY} "
                              "figures on hpctrain's engine (training and validation "
                              f"counted apart), and these were logged: "
                              f"{', '.join(slot.name for slot in self.slots)}")
        self.slots.append(Slot(stage, name, reduction, on_step, on_epoch))
        return len(self.slots) - 1

    def values(self, sums: dict, read: str, reset: bool = True) -> dict:
        """The figures of `read` (READS) with a weight in `sums` (read back, over all ranks),
        under their records' names: means (or sums); a Metric's compute() over what it
        gathered since, then reset (on every rank alike, in slot order: its compute syncs
        the ranks) unless this is a look before the read (`reset` false). callback_metrics
        (`latest`) sees them under their plain names too."""
        read_back = {}
        for index, slot in enumerate(self.slots):
            total, weight = sums[f"{index}:sum"], sums[f"{index}:weight"]
            if weight <= 0 or not slot.read_at(read):
                continue
            if slot.reduction == METRIC and not (slot.forked and read == INTERVAL):
                value = _computed(slot.name, self.metrics[index], reset)
            else:
                value = total if slot.reduction == "sum" else total / weight
            read_back[slot.named(read)] = value
            self.latest[slot.name] = value
        self.latest.update(read_back)
        return read_back

    def reads_epochs(self) -> bool:
        """Whether a training figure was logged on_epoch (the same on every rank, as the
        names logged are)."""
        return any(slot.read_at(EPOCH) for slot in self.slots)

    def state(self) -> list[dict]:
        return [asdict(slot) for slot in self.slots]

    def restore(self, saved, source: str) -> None:
        """The slots a checkpoint's run had logged into, in its order (their epoch sums are
        in those places), or a ConfigError naming `source` where they are damaged."""
        fields = {"stage": str, "name": str, "reduction": str, "on_step": bool,
                  "on_epoch": bool}
        if not (isinstance(saved, list) and len(saved) <= CAPACITY and all(
                isinstance(entry, dict) and entry.keys() == fields.keys() and all(
                    isinstance(entry[key], kind) for key, kind in fields.items())
                for entry in saved)):
            raise ConfigError(f"{source}: hpctrain's state of the module is damaged; it is "
                              "written by hpctrain: resume from an earlier checkpoint")
        self.slots = [Slot(**entry) for entry in saved]


def metric_states(module: nn.Module, metrics) -> dict[str, dict]:
    """The state so far of each Metric in `metrics` (in slot order), gathered from every
    rank (its own sync: a collective where there are several), by its attribute in
    `module` (as Lightning finds a logged Metric), or a ConfigError naming one that is not
    an attribute."""
    names = {id(value): name for name, value in module.named_modules()}
    states = {}
    for metric in metrics:
        if id(metric) not in names:
            raise ConfigError(
                f"a {type(metric).__name__} logged with self.log is not an attribute of "
                f"{type(module).__name__}: hpctrain keeps a Metric's state in checkpoints "
                "under its attribute's name (as Lightning finds a logged Metric); set it in "
                "__init__ as self.NAME = ...")
        with metric.sync_context():
            states[names[id(metric)]] = {name: moved(value, "cpu")
                                         for name, value in metric.metric_state.items()}
    return states


def restore_metric_states(module: nn.Module, states, source: str) -> None:
    """A checkpoint's Metric states set into `module`'s Metrics, or a ConfigError naming
    `source` where they do not fit them."""
    for name, state in states.items() if isinstance(states, dict) else [(None, None)]:
        metric = module.get_submodule(name) if isinstance(name, str) and name in dict(
            module.named_modules()) else None
        if not (_is_metric(metric) and isinstance(state, dict) and state.keys() ==
                metric.metric_state.keys() and all(map(_is_state, state.values()))):
            raise ConfigError(f"{source}: the module's Metric states do not fit its Metrics "
                              f"({name!r}): resume with the module that saved it")
        for key, value in state.items():
            setattr(metric, key, moved(value, metric.device))


def moved(value, device):
    """A Metric's state (a tensor, or a list of them) on `device`."""
    if isinstance(value, list):
        return [item.to(device) for item in value]
    return value.to(device)


def _is_state(value) -> bool:
    return isinstance(value, torch.Tensor) or (
        isinstance(value, list) and all(isinstance(item, torch.Tensor) for item in value))


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_metric(value) -> bool:
    return any(c.__name__ == "Metric" and c.__module__.startswith("torchmetrics")
               for c in type(value).__mro__)


def _computed(name: str, metric, reset: bool = True) -> float:
    """A logged Metric's value over what it gathered, the Metric reset for the next read
    (`reset`)."""
    value = metric.compute()
    if reset:
        metric.reset()
    return float(_number(name, value))


def _number(name: str, value) -> torch.Tensor:
    """A logged value as a 0-d tensor (detached; a boolean as 1.0 or 0.0, as Lightning logs
    it), or a ConfigError saying what it was."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.detach().reshape(()).to(torch.get_default_dtype()) \
            if value.dtype == torch.bool else value.detach().reshape(())
    if _is_real(value) or isinstance(value, bool):
        return torch.tensor(float(value))
    what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else \
        f"a {type(value).__name__}"
    raise ConfigError(f"self.log({name!r}, ...) was given {what}: hpctrain's engine logs "
                      "one number per name (or a torchmetrics Metric giving one)")
