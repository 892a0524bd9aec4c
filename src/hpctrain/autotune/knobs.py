"""What autotune may change, and to what, on this device for this recipe.

Each knob is a setting of the recipe with its candidate choices, the recipe's own first (as
the run would resolve it: `auto` decided by the engine's own rules, train/hardware/system.py,
so the baseline is what `hpctrain run` would do). A choice is the `key=value` settings that
make it; the recipe's own choice sets nothing. Choices this device cannot run are left out and
said (fp16 on a CPU), knobs the user fixed (`--fix`) are not searched.

The micro-batch keeps the global batch (samples per optimiser step) through gradient
accumulation, so the optimisation is the recipe's; precision changes the numbers a run
computes and is named as such (`numerics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain.config import Config
from hpctrain.errors import ConfigError, DeviceError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
ACCUMULATIONS = (1, 2, 4, 8)  # micro-batches per optimiser step tried
WORKER_COUNTS = (0, 1, 2, 4, 8, 16)
ACTIVATION_CHECKPOINTING = "model.activation_checkpointing"


@dataclass(frozen=True)
class Choice:
    knob: str
    label: str
    settings: tuple[tuple[str, object], ...] = ()  # () for the recipe's own
    position: float | None = None  # on an ordered knob's line, the usually faster way up


def settings_of(choices) -> list[str]:
    """The key=value settings that make `choices` (Choice objects), as the command line
    reads them."""
    from hpctrain.tune.space import override

    return [override(key, value) for choice in choices for key, value in choice.settings]


@dataclass
class Knob:
    name: str
    choices: list[Choice]  # the recipe's own first
    numerics: bool = False  # the choice changes what the run computes, not only how fast
    note: str = ""  # what was left out, and why

    @property
    def own(self) -> Choice:
        return self.choices[0]


@dataclass
class Space:
    knobs: list[Knob]
    fixed: dict[str, str] = field(default_factory=dict)  # key -> value the user kept
    notes: list[str] = field(default_factory=list)  # knobs not searched, and why

    def knob(self, name: str) -> Knob | None:
        return next((k for k in self.knobs if k.name == name), None)


def own_choice(knob: str, label: str, position: float | None = None) -> Choice:
    return Choice(knob, f"{label} (recipe)", position=position)


def space_of(config: Config, fixed: dict[str, str], processes: int = 1) -> Space:
    """The knobs of `config` on this machine's device; `fixed`: keys the user keeps (their
    values already in `config`); `processes`: devices the run trains on."""
    from hpctrain.train.hardware.system import plan_system

    plan = plan_system(config)
    space = Space([], dict(fixed))
    for make in (_precision, _compile, _channels_last, _micro_batch, _workers, _decode,
                 _strategy):
        knob = make(config, plan, processes)
        if knob is None:
            continue
        keys = {key for choice in knob.choices for key, _ in choice.settings}
        if keys & set(fixed):
            space.notes.append(f"{knob.name}: kept as given ({', '.join(sorted(keys & set(fixed)))}"
                               " fixed)")
        elif len(knob.choices) < 2:
            space.notes.append(f"{knob.name}: {knob.note or knob.own.label + ' only'}")
        else:
            space.knobs.append(knob)
            if knob.note:
                space.notes.append(f"{knob.name}: {knob.note}")
    return space


def _precision(config: Config, plan, processes: int) -> Knob:
    import torch

    from hpctrain.train.hardware.system import resolve_device, resolve_precision

    device = resolve_device(config.device)
    choices, refused = [own_choice("precision", plan.precision)], []
    for name in PRECISIONS:
        if name == plan.precision:
            continue
        try:
            resolve_precision(name, device)
        except (DeviceError, ConfigError):
            refused.append(name)
            continue
        if name == "tf32" and device.type == "cuda" and \
                torch.cuda.get_device_capability(device) < (8, 0):
            refused.append(name)
            continue
        choices.append(Choice("precision", name, (("precision", name),)))
    note = f"{', '.join(refused)} not on this {device.type}" if refused else ""
    return Knob("precision", choices, numerics=True, note=note)


def _compile(config: Config, plan, processes: int) -> Knob:
    from hpctrain.train.hardware.system import resolve_device

    on_gpu = resolve_device(config.device).type == "cuda"
    runs, why = _mode_run(config, on_gpu, processes) if plan.compile else (None, "")
    own = "off" if not plan.compile else f"on, {runs}" if runs == config.compile_mode else \
        f"on, {runs} (auto)"
    choices = [own_choice("compile", own)]
    modes = ("default", "max-autotune-no-cudagraphs", "reduce-overhead") if on_gpu else \
        ("default",)  # CUDA graphs and Triton autotuning are GPU matters
    if plan.compile:
        choices.append(Choice("compile", "off", (("compile", False),)))
    for mode in modes:
        if not (plan.compile and mode == runs):
            choices.append(Choice("compile", f"on, {mode}",
                                  (("compile", True), ("compile_mode", mode))))
    return Knob("compile", choices, note=why)


def _mode_run(config: Config, on_gpu: bool, processes: int) -> tuple[str, str]:
    """(the compile mode the recipe runs, why it is not known): compile_mode=auto's decision
    for the model's size (counted on the meta device, as `hpctrain memory` builds it), so
    that no trial repeats the recipe's own; `auto` where the model cannot be built there,
    with why, and each mode then tried."""
    if config.compile_mode != "auto":
        return config.compile_mode, ""
    if not on_gpu:
        return "default", ""
    from hpctrain.autotune.fit import cannot_trace, untold
    from hpctrain.memory.estimate import model_info, output_width, resolve_target, step_spec
    from hpctrain.train.compilation import auto_mode

    try:
        target = resolve_target(config, None, processes)
        spec = step_spec(config, target, output_width(config)[0])
        parameters = model_info(spec, target.precision).parameters
    except cannot_trace() as err:
        return "auto", f"compile_mode=auto's choice unknown ({untold(err)}): every mode tried"
    return auto_mode(config, on_gpu, processes, parameters)[0], ""


def _channels_last(config: Config, plan, processes: int) -> Knob | None:
    if not config.data.kind_spec.channels_first:
        return None  # no 4-D image tensors to lay out
    own = own_choice("channels_last", "on" if plan.channels_last else "off")
    other = Choice("channels_last", "off" if plan.channels_last else "on",
                   (("channels_last", not plan.channels_last),))
    return Knob("channels_last", [own, other], note=plan.note)


def global_batch(config: Config, processes: int) -> int:
    """Samples per optimiser step, as the run would make them."""
    train = config.train
    return train.global_batch_size or train.batch_size * processes * train.grad_accum_steps


def _micro_batch(config: Config, plan, processes: int) -> Knob | None:
    if _your_loader_sets(config):
        return Knob("micro-batch", [own_choice("micro-batch", "your DataLoader's")],
                    note="your DataLoader's batch size is kept")
    total, own_accum = global_batch(config, processes), config.train.grad_accum_steps
    own_micro = total // (processes * own_accum)
    choices = [own_choice("micro-batch", f"{own_micro} x {own_accum}", own_micro)]
    for accum in ACCUMULATIONS:
        if accum != own_accum and total % (processes * accum) == 0:
            choices.append(Choice("micro-batch", f"{total // (processes * accum)} x {accum}",
                                  (("train.global_batch_size", total),
                                   ("train.grad_accum_steps", accum)),
                                  total // (processes * accum)))
    if config.model.activation_checkpointing:  # the recipe's own recomputes: try without
        choices.append(Choice("micro-batch", f"{own_micro} x {own_accum}, no activation "
                              "checkpointing", ((ACTIVATION_CHECKPOINTING, False),)))
    return Knob("micro-batch", choices, note=f"global batch {total} kept")


def with_checkpointing(choice: Choice) -> Choice:
    """The same micro-batch with activation checkpointing: for one the memory prediction
    says does not fit without it."""
    return Choice(choice.knob, f"{choice.label} + activation checkpointing",
                  (*choice.settings, (ACTIVATION_CHECKPOINTING, True)))


def _workers(config: Config, plan, processes: int) -> Knob | None:
    from hpctrain.data.loader import resolve_num_workers, usable_cpus

    if _your_loader_sets(config):
        return Knob("workers", [own_choice("workers", "your DataLoader's")],
                    note="your DataLoader's workers are kept")
    own = resolve_num_workers(config.data.num_workers, processes)
    most = max(1, usable_cpus() // processes)
    choices = [own_choice("workers", str(own), own)]
    choices += [Choice("workers", str(n), (("data.num_workers", n),), n) for n in WORKER_COUNTS
                if n != own and n <= most]
    return Knob("workers", choices, note=f"up to {most} (this process's share of the cores)")


def _decode(config: Config, plan, processes: int) -> Knob | None:
    if config.data.dataset != "shards" or not plan.device.startswith("cuda"):
        return None
    other = "gpu" if config.data.images.decode == "cpu" else "cpu"
    return Knob("decode", [own_choice("decode", config.data.images.decode),
                           Choice("decode", other, (("data.images.decode", other),))])


def _strategy(config: Config, plan, processes: int) -> Knob | None:
    """How the data dimension holds the model, where there are several processes: each
    holding it whole (DDP) or a shard of it (FSDP). Tensor and pipeline splits are kept."""
    from hpctrain.config.parallel_settings import Strategy
    from hpctrain.parallel.layout import layout_of

    if processes < 2:
        return None
    own = layout_of(config, processes, f"autotune --processes {processes}")
    if own is None or own.strategy == Strategy.NONE:
        return None
    other = Strategy.FSDP if own.strategy == Strategy.DDP else Strategy.DDP
    return Knob("strategy", [own_choice("strategy", str(own.strategy)),
                             Choice("strategy", str(other), (("parallel.strategy", str(other)),))],
                note="tensor and pipeline splits kept as the recipe has them")


def _your_loader_sets(config: Config) -> bool:
    """Your own training DataLoader makes the batches: its batch size and workers are kept."""
    if not config.data.from_user_code:
        return False
    from hpctrain.data.user_datasets import loader_settings

    return loader_settings(config.data, config.seed)[0] is not None
