"""From the estimate to a decision, following the matrix researchers use:

- everything fits: plain data parallelism (DDP), and how much larger a batch would fit;
- the model states (parameters, gradients, optimiser states) do not fit: FSDP with the
  smallest sharding degree that fits;
- the activations do not fit: activation checkpointing, gradient accumulation, bf16, a lower
  resolution, each with its predicted peak;
- a layout of tensor and pipeline parallelism (for models with a plan: the GPT) that fits
  with the fewest devices, offered beside those, and the answer when nothing else fits.

Every option is an hpctrain setting (or a `--gpus` for hpctrain submit) with its prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hpctrain.config import Config, Strategy
from hpctrain.errors import ConfigError
from hpctrain.memory.estimate import Estimate, Target, estimate, with_layout
from hpctrain.units import fmt_bytes

DEGREES = [2**k for k in range(1, 11)]  # FSDP over 2 .. 1024 devices
MAX_BATCH = 65536  # the largest per-device batch worth naming


@dataclass
class Option:
    settings: list[str]
    in_use: int  # predicted device memory in use
    fits: bool
    effect: str

    def to_json(self) -> dict:
        return {"settings": self.settings, "in_use_bytes": self.in_use, "fits": self.fits,
                "effect": self.effect}


@dataclass
class Advice:
    decision: str  # fits | shard | activations | model-parallel
    summary: str
    options: list[Option] = field(default_factory=list)
    largest_batch: int | None = None  # per device, where the peak meets the device's limit

    def to_json(self) -> dict:
        return {"decision": self.decision, "summary": self.summary,
                "largest_batch": self.largest_batch,
                "options": [o.to_json() for o in self.options]}


def _variant(config: Config, *overrides: tuple[str, object]) -> Config:
    tree = config.model_dump()
    for key, value in overrides:
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return Config.model_validate(tree)


def _checkpointing(config: Config, target: Target, batch: int, on: bool) -> Estimate | None:
    """The estimate with activation checkpointing on or off (None when the model has no block
    to checkpoint)."""
    try:
        return estimate(_variant(config, ("model.activation_checkpointing", on)), target, batch)
    except ConfigError:
        return None


def checkpointing_counterpart(base: Estimate, config: Config) -> Estimate | None:
    """The same estimate with activation checkpointing switched the other way."""
    return _checkpointing(config, base.target, base.batch_size,
                          not config.model.activation_checkpointing)


def largest_batch(base: Estimate, config: Config) -> tuple[int, Estimate | None]:
    """Where the peak meets the device's limit, and the estimate at that batch rounded down
    to a multiple of 8 where one was made (it fits). The peak is the highest of lines in the
    batch (each allocation's bytes grow linearly with it), so it is convex: the line through
    two batches that fit promises too much where the peak changes phase (the optimiser's at
    small batches, checkpointed activations' at large ones; gpt-1b's line through 12 and 24
    promised 237 on an H200, where 232 needs 157 GiB). So that guess is estimated; where it
    does not fit, the line through it and the largest batch that does meets the limit at or
    below the true largest, which convexity makes fit without another estimate."""
    other = max(1, base.batch_size // 2) if base.batch_size > 1 else 2
    second = estimate(config, base.target, other)
    fitting = max((e for e in (base, second) if e.fits), key=lambda e: e.batch_size,
                  default=None)
    top = min(_on_the_line(base, second), data_bound(base, config) or MAX_BATCH)
    if fitting is None or round_batch(top) <= fitting.batch_size or top >= MAX_BATCH:
        return top, None
    guess = estimate(config, base.target, round_batch(top))
    return (top, guess) if guess.fits else (_on_the_line(fitting, guess), None)


def data_bound(base: Estimate, config: Config) -> int | None:
    """The largest per-device batch the training set fills for one whole step (its samples
    over the data devices and the accumulation), or None where its size is unknown."""
    from hpctrain.memory.tensor_batches import training_samples

    samples = training_samples(config)
    if samples is None:
        return None
    return max(1, samples // (base.target.data * config.train.grad_accum_steps))


def _filled(bound: int, base: Estimate, config: Config) -> str:
    """Why `bound` (data_bound) is the largest batch worth naming."""
    from hpctrain.memory.tensor_batches import training_samples

    devices, micro = base.target.data, config.train.grad_accum_steps
    return (f"the largest per-device batch the training set fills, in multiples of 8: its "
            f"{training_samples(config):,} samples make one step of at most {bound:,} per "
            "device" + (f" on {devices} devices" if devices > 1 else "")
            + (f" x {micro} micro-batches" if micro > 1 else "")
            + " (a larger batch would have no whole step)")


def _on_the_line(a: Estimate, b: Estimate) -> int:
    """Where the line of the peak through two estimates reaches what the device allows."""
    slope = (a.peak - b.peak) / (a.batch_size - b.batch_size)
    if slope <= 0:
        return MAX_BATCH
    fixed = a.peak - slope * a.batch_size
    return min(MAX_BATCH, max(0, math.floor((a.target.usable() - fixed) / slope)))


def round_batch(batch: int) -> int:
    """Down to a multiple of 8 (Tensor Core tiles), when there is one."""
    return batch // 8 * 8 if batch >= 8 else batch


def _option(settings: list[str], est: Estimate, effect: str) -> Option:
    return Option(settings, est.in_use, est.fits, effect)


def smallest_fsdp(base: Estimate, config: Config) -> Estimate | None:
    for degree in DEGREES:
        sharded = with_layout(base, config, degree, Strategy.FSDP)
        if sharded.fits:
            return sharded
    return None


def _states_fit(base: Estimate) -> bool:
    """Do parameters, gradients and optimiser states fit on one device without sharding?"""
    states = sum(base.footprint.at_peak[k] for k in ("parameters", "optimizer states"))
    states += base.info.gradient_bytes()
    return states <= base.target.usable()


def advise(base: Estimate, config: Config, counterpart: Estimate | None = None) -> Advice:
    """`counterpart`, the checkpointing counterpart when the caller has it, saves simulating
    that step again."""
    cap = fmt_bytes(base.target.capacity)
    if base.fits:
        top, rounded = largest_batch(base, config)
        advice = Advice("fits", f"fits: {fmt_bytes(base.in_use)} of {cap} per device; "
                        "data parallelism needs no sharding (parallel.strategy=ddp)",
                        largest_batch=top)
        if round_batch(top) > base.batch_size:
            bigger = rounded or estimate(config, base.target, round_batch(top))
            bound = data_bound(base, config)
            advice.options.append(_option(
                [f"train.batch_size={round_batch(top)}"], bigger,
                f"the largest per-device batch that fits in multiples of 8 (the peak meets "
                f"the limit near {top})" if top != bound else
                _filled(bound, base, config)))
        return advice
    if not _states_fit(base):
        extra: list[str] = []
        sharded = smallest_fsdp(base, config)
        if sharded is None:  # sharding alone is not enough: checkpoint and shrink the batch
            small = _smallest_step(base, config)
            sharded, extra = smallest_fsdp(small, config), _settings_of(small, config)
        if sharded is None:
            return _model_parallel(base, config)
        split = split_layouts(base, config)
        if split and split[0].fits and (not sharded.fits or extra):
            return _split_advice(base, split)
        n = sharded.target.layout.world_size
        return Advice("shard", f"the model states alone do not fit on one {cap} device: "
                      f"shard them with FSDP over {n} devices", [_option(
                          ["parallel.strategy=fsdp", f"--gpus {n}", *extra], sharded,
                          f"parameters, gradients and optimiser states split {n} ways")])
    return _activation_options(base, config, counterpart)


def _activation_options(base: Estimate, config: Config,
                        counterpart: Estimate | None) -> Advice:
    cap = fmt_bytes(base.target.capacity)
    advice = Advice("activations", f"the activations of batch {base.batch_size} do not fit "
                    f"in {cap}: {fmt_bytes(base.in_use)} predicted")
    options = advice.options
    if not config.model.activation_checkpointing:
        ckpt = counterpart or checkpointing_counterpart(base, config)
        if ckpt is not None:
            options.append(_option(["model.activation_checkpointing=true"], ckpt,
                                   "recompute each block in backward: about a third more "
                                   "compute"))
    top, _ = largest_batch(base, config)
    if top >= 1:
        steps = 2 ** math.ceil(math.log2(base.batch_size / top))
        micro = max(1, base.batch_size // steps)
        accum = estimate(config, base.target, micro)
        options.append(_option(
            [f"train.batch_size={micro}", f"train.grad_accum_steps="
             f"{config.train.grad_accum_steps * steps}"], accum,
            f"the same samples per optimiser step in {steps} micro-batches"))
    if base.target.precision in ("fp32", "tf32"):
        half = estimate(_variant(config, ("precision", "bf16")),
                        replace(base.target, precision="bf16"), base.batch_size)
        options.append(_option(["precision=bf16"], half, "activations in 16 bits"))
    smaller = config.data.kind_spec.smaller_sample(config.data, base.input_shape)
    if smaller is not None:
        setting, value, words = smaller
        shrunk = estimate(_variant(config, (setting, value)), base.target, base.batch_size)
        options.append(_option([f"{setting}={value}"], shrunk, words))
    sharded = smallest_fsdp(base, config)
    if sharded is not None:
        n = sharded.target.layout.world_size
        options.append(_option(["parallel.strategy=fsdp", f"--gpus {n}"], sharded,
                               f"model states split {n} ways leave room for activations"))
    options.extend(_split_option(est) for est in split_layouts(base, config))
    options.sort(key=lambda o: (not o.fits, o.in_use))
    return advice


def split_layouts(base: Estimate, config: Config) -> list[Estimate]:
    """Layouts of tensor (within a node: up to 8) and pipeline parallelism that fit, fewest
    devices first (tensor parallelism before pipelines at equal counts); or, when none fits,
    the one that comes closest. Empty for a model without a plan or at such a layout already."""
    info, target = base.info, base.target
    if target.layout.model_parallel or not (info.tensor_sizes or info.pipeline_sizes):
        return []
    layouts = sorted(((t, p) for t in (1, *info.tensor_sizes) for p in
                      (1, *info.pipeline_sizes) if t * p > 1), key=lambda tp: (tp[0] * tp[1],
                                                                             tp[1]))
    tried = [with_layout(base, config, t * p, Strategy.NONE, t, p) for t, p in layouts]
    fitting = [est for est in tried if est.fits]
    return fitting[:2] if fitting else [min(tried, key=lambda est: est.in_use)]


def _split_option(est: Estimate) -> Option:
    t = est.target.layout
    effect = " and ".join(part for part in (
        f"each layer's matrices split over {t.tensor} GPUs of a node" if t.tensor > 1 else "",
        f"the blocks cut into {t.pipeline} pipeline stages" if t.pipeline > 1 else "") if part)
    return _option([*est.target.layout_settings(), f"--gpus {t.world_size}"], est, effect)


def _split_advice(base: Estimate, layouts: list[Estimate]) -> Advice:
    best = layouts[0].target
    return Advice("model-parallel", f"the model does not fit on one "
                  f"{fmt_bytes(base.target.capacity)} device at batch {base.batch_size}: split "
                  f"it over {best.layout.world_size} with {' '.join(best.layout_settings())}",
                  [_split_option(est) for est in layouts])


def _smallest_step(base: Estimate, config: Config) -> Estimate:
    """Batch 1, with activation checkpointing where the model allows it."""
    checkpointed = None if config.model.activation_checkpointing else \
        _checkpointing(config, base.target, 1, True)
    return checkpointed or estimate(config, base.target, 1)


def _settings_of(small: Estimate, config: Config) -> list[str]:
    settings = ["train.batch_size=1"]
    if small.activation_checkpointing and not config.model.activation_checkpointing:
        settings.insert(0, "model.activation_checkpointing=true")
    return settings


def _model_parallel(base: Estimate, config: Config) -> Advice:
    """Even FSDP over 1024 devices does not fit: the layout that splits the layers, or how
    many devices a split would need."""
    if base.target.usable() <= 0:  # no layout helps: the device holds less than CUDA's own
        return Advice("model-parallel", f"nothing fits on {fmt_bytes(base.target.capacity)} "
                      f"devices: the CUDA context alone takes {fmt_bytes(base.target.context)}"
                      " of each; check --gpu-memory")
    split = split_layouts(base, config)
    if split and split[0].fits:
        return _split_advice(base, split)
    one = _smallest_step(with_layout(base, config, 1, Strategy.NONE), config)
    need = math.ceil(one.peak / base.target.usable())
    return Advice("model-parallel", f"nothing fits on {fmt_bytes(base.target.capacity)} "
                  "devices even sharded over 1024 of them: split the layers over at least "
                  f"{need} devices with parallel.tensor (within a node) and parallel.pipeline; "
                  "this estimate does not predict those layouts yet", [_option(
                      ["parallel.strategy=fsdp", "--gpus 1024", *_settings_of(one, config)],
                      with_layout(one, config, 1024, Strategy.FSDP),
                      "the least hpctrain can hold per device")])
