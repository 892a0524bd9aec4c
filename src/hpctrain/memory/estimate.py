"""A recipe's predicted memory per device: the simulated step, then what the parallel layout
changes (tensor and pipeline parallelism's split of the model, DDP's persistent gradient
buckets, FSDP's shards and gathered parameters), then what the CUDA allocator and context add,
against the device's capacity.

The layout effects are computed, not simulated: one device's step is simulated once and the
arithmetic applied for any layout, so the advice can try many layouts for free. For tensor and
pipeline parallelism that arithmetic is:
- model states: a pipeline stage holds 1/pipeline of the blocks plus what lies outside them
  (the embedding or the output layer); tensor parallelism splits what its plan splits;
- activations: Megatron-LM's accounting (Korthikanti et al., 2022) of a transformer layer's
  34 bytes per token and width unit (flash attention): 24 of them are split by tensor
  parallelism, the other 10 (norms, residual stream) only by sequence parallelism; a stage
  holds its layers' activations for the micro-batches in flight: all m under GPipe,
  min(p, m) under 1F1B (the first stage, the fullest).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from hpctrain.config import Config, Strategy
from hpctrain.errors import ConfigError, UserError
from hpctrain.memory.simulate import Footprint, StepSpec, predict, shared_build
from hpctrain.memory.sizes import gpu_capability, lacks_bf16, parse_memory
from hpctrain.units import fmt_bytes
from hpctrain.memory.tensor_batches import batch_of, first_sample, leading_shape
from hpctrain.models.checkpointing import enable_activation_checkpointing, is_block
from hpctrain.models.gpt import GPT
from hpctrain.models.lazy import materialise
from hpctrain.models.model_names import build_model
from hpctrain.parallel.data import bf16_parameters
from hpctrain.parallel.layout import (MICROBATCHES_PER_STAGE, Layout, layout_of, model_copy,
                                      split_world)
from hpctrain.parallel.processes import per_device_batch
from hpctrain.tasks import lightning, lightning_optim, tensors
from hpctrain.tasks.spec import TaskSetup
from hpctrain.tasks.steps import Batch, logits_of
from hpctrain.train.hardware.system import resolve_precision
from hpctrain.train.optimizers.optim import build_optimizer, freeze, scaled_lr

CONTEXT_BYTES = 512 * 2**20  # CUDA context, cuBLAS/cuDNN handles, NCCL: outside torch's count
ALLOCATOR_OVERHEAD = 0.10  # caching-allocator blocks reserved but not allocated, at the peak
DEFAULT_GPU = "h100"  # assumed where no GPU is visible and none is named


@dataclass(frozen=True)
class Target:
    """Where the recipe will run: device kind, precision, capacity, layout."""

    device: str  # cuda | cpu
    precision: str
    capacity: int
    capacity_source: str
    layout: Layout = Layout(1)  # how the devices divide the work (parallel/layout.py)
    sequence_parallel: bool = False
    microbatches: int = 1  # pipeline micro-batches per step
    schedule: str = "1f1b"
    capability: tuple[int, int] = (9, 0)  # the GPU's compute capability (its attention kernel)

    @property
    def data(self) -> int:
        """Devices in the data dimension (the FSDP sharding degree)."""
        return self.layout.data

    def layout_settings(self) -> list[str]:
        """This layout as hpctrain settings (none for data parallelism alone)."""
        sequence = ["parallel.sequence_parallel=true"] if self.sequence_parallel and \
            self.layout.tensor > 1 else []
        return self.layout.settings() + sequence

    @property
    def context(self) -> int:
        return CONTEXT_BYTES if self.device == "cuda" else 0

    @property
    def overhead(self) -> float:
        return ALLOCATOR_OVERHEAD if self.device == "cuda" else 0.0

    def usable(self) -> int:
        """The most the step itself may allocate."""
        return int((self.capacity - self.context) / (1 + self.overhead))


@dataclass(frozen=True)
class ModelInfo:
    """The parameter counts the layout arithmetic needs, from the model built on meta."""

    parameters: int  # all of them
    trainable: int
    largest_unit: int  # parameters of the largest FSDP unit (a block, or the rest)
    bf16_gather: bool  # FSDP would gather bf16 copies
    block_parameters: int = 0  # in the repeated blocks (what a pipeline divides)
    split_parameters: int = 0  # in what the tensor-parallel plan splits (0: no plan)
    tensor_sizes: tuple[int, ...] = ()  # tensor-parallel sizes the model's shapes allow
    pipeline_sizes: tuple[int, ...] = ()  # pipeline sizes it allows (its blocks divide)
    sequence_parallel: bool = False  # its plan can split the sequence too (the GPT's)

    def gradient_bytes(self) -> int:
        return self.trainable * 4


@dataclass
class Estimate:
    recipe: str
    model: str
    batch_size: int  # per device and micro-step
    input_shape: tuple[int, ...]
    target: Target
    info: ModelInfo
    footprint: Footprint  # one device, no parallelism
    rows: dict[str, int]  # per device, with the layout applied
    activation_checkpointing: bool
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        """What torch.cuda.max_memory_allocated would report."""
        return sum(self.rows.values())

    @property
    def in_use(self) -> int:
        """What the device would have in use at the peak (nvidia-smi)."""
        return int(self.peak * (1 + self.target.overhead)) + self.target.context

    @property
    def fits(self) -> bool:
        return self.in_use <= self.target.capacity

    @property
    def model_states(self) -> int:
        return sum(self.rows.get(k, 0) for k in ("parameters", "gradients", "optimizer states",
                                                  "gradient buckets"))

    @property
    def method(self) -> str:
        return {"fake": "simulated on fake tensors (no memory used)",
                "extrapolated": "measured on the CPU at two small batches, extrapolated"}[
            self.footprint.method]

    def to_json(self) -> dict:
        t = self.target
        return {"recipe": self.recipe, "model": self.model, "batch_size": self.batch_size,
                "input_shape": list(self.input_shape), "method": self.footprint.method,
                "device": t.device, "precision": t.precision,
                "world_size": t.layout.world_size, "strategy": t.layout.strategy,
                "tensor": t.layout.tensor, "pipeline": t.layout.pipeline,
                "capacity_bytes": t.capacity,
                "capacity_source": t.capacity_source,
                "activation_checkpointing": self.activation_checkpointing,
                "parameters": self.info.parameters, "breakdown_bytes": self.rows,
                "peak_allocated_bytes": self.peak,
                "allocator_overhead_bytes": int(self.peak * t.overhead),
                "context_bytes": t.context, "in_use_bytes": self.in_use, "fits": self.fits,
                "notes": self.notes + self.footprint.notes}


def resolve_target(config: Config, gpu_memory: str | None, world_size: int = 1) -> Target:
    """The device the recipe is meant for: a GPU unless config.device says cpu; its capacity
    from --gpu-memory, else this machine's GPU, else an H100 (said so)."""
    device = "cpu" if config.device == "cpu" else "cuda"
    if device == "cuda":
        precision = config.precision
        if precision == "auto":  # bf16 from Ampere on; a V100 named or present has fp16 only
            precision = "fp16" if lacks_bf16(gpu_memory) or (
                torch.cuda.is_available() and not torch.cuda.is_bf16_supported()) else "bf16"
    else:
        precision = resolve_precision(config.precision, torch.device("cpu"))
    capability = gpu_capability(DEFAULT_GPU)
    if gpu_memory is not None:
        capacity, source = parse_memory(gpu_memory), f"--gpu-memory {gpu_memory}"
        capability = gpu_capability(gpu_memory) or capability
    elif device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        capacity, source = props.total_memory, f"this machine's {props.name}"
        capability = (props.major, props.minor)
    elif device == "cuda":
        capacity = parse_memory(DEFAULT_GPU)
        source = f"assumed {DEFAULT_GPU.upper()} ({fmt_bytes(capacity)}); no GPU here, give " \
                 "--gpu-memory"
    else:
        raise ConfigError("device=cpu: give the memory a process may use with --gpu-memory "
                          "(for example --gpu-memory 8GiB)")
    p = config.parallel
    layout = layout_of(config, world_size, f"--world-size {world_size}")
    if layout is None:
        raise ConfigError(f"--world-size {world_size} is not a multiple of "
                          f"{model_copy(config)[1]}")
    micro = 1
    if p.pipeline > 1:
        micro = p.microbatches if p.microbatches != "auto" else \
            MICROBATCHES_PER_STAGE * p.pipeline
    return Target(device, precision, capacity, source, layout, p.sequence_parallel, micro,
                  p.schedule, capability)


def output_width(config: Config) -> tuple[int, str | None]:
    """The model's output width (classes, or a language model's vocabulary), without reading
    a large dataset when it can be avoided (the kind's `width`); and a note when it had to
    be assumed."""
    data, kind = config.data, config.data.kind_spec
    if kind.any_shape:  # your own tensors: the data says it, or the model's output
        return (data.num_classes or first_sample(config).num_classes), None
    if kind.vocabulary:  # your own: said, or read below
        if not data.from_user_code:
            return kind.width(data)
        if data.tokens.vocab_size:
            return data.tokens.vocab_size, None
    if data.num_classes:
        return data.num_classes, None
    known = None if data.from_user_code else kind.width(data)
    if known is not None:
        return known
    from hpctrain.cluster.environment import node_local_scratch
    from hpctrain.data.loader import build_datasets

    try:
        found = build_datasets(data, config.seed, scratch=node_local_scratch())[2]
        return (found, None) if found else (1000, "number of classes assumed 1000 (the data "
                                            "does not say it); set data.num_classes")
    except UserError as err:
        return 1000, f"number of classes assumed 1000 ({err}); set data.num_classes"


def input_shape(config: Config) -> tuple[int, ...]:
    """One sample's shape: (channels, height, width), (tokens,) or (points, 3), the kind's
    `sample_shape`; your own tensors' (their first tensor's, where nested)."""
    shape = config.data.kind_spec.sample_shape(config.data)
    return leading_shape(first_sample(config)) if shape is None else shape


def task_loss(config: Config, num_classes: int | None, device: torch.device):
    """criterion(outputs, targets): the task's own loss, as its spec builds it for training
    (no loss of memory's own); where the data does not say the classes, the outputs do (their
    second axis, as training reads them: train/build.py)."""
    built = {}

    def criterion(outputs, targets):
        width = num_classes or logits_of(outputs).shape[1]
        if width not in built:
            built[width] = config.task_spec.build(TaskSetup(
                config, device, width, None, 1))
        return built[width].loss(outputs, Batch(None, targets, targets))
    return criterion


def _step_loss(outputs, targets) -> torch.Tensor:
    """The loss a LightningModule's training_step gave (lightning_step.StepOutput)."""
    return outputs.loss


def step_spec(config: Config, target: Target, width: int) -> StepSpec:
    """The recipe's step; `width`: its classes or its vocabulary (output_width)."""
    shape = input_shape(config)
    kind = config.data.kind_spec
    tokens, own = kind.vocabulary, kind.any_shape
    optim_device = torch.device(target.device)
    lr = scaled_lr(config.optim, per_device_batch(config, target.data)[1])

    steps_model = config.task_spec.steps_model  # a LightningModule: its own step and optimiser

    def build() -> nn.Module:
        model = build_model(config.model.name, None if tokens else width, config.model.kwargs,
                            vocab_size=width if tokens else None,
                            kind=kind.name, image_sizes=kind.image_sizes(config.data))
        materialise(model, lambda made: tensors.call(made, make_batch(
            1, torch.get_default_device())[0]), config.model.name)
        freeze(model, config.model.freeze)  # no gradients nor optimiser states for those
        if steps_model:
            model = lightning.adapt(model, torch.device("cpu"))
        if config.model.activation_checkpointing:
            model = enable_activation_checkpointing(model, config.model.name)
        return model

    def make_batch(batch: int, device: torch.device):
        if steps_model:  # the module's step takes the whole batch
            return {"batch": batch_of(first_sample(config), batch, device)[0],
                    "rows": batch}, None
        if own:
            return batch_of(first_sample(config), batch, device)
        if tokens:
            return (torch.randint(0, width, (batch, *shape), device=device),
                    torch.randint(0, width, (batch, *shape), device=device))
        return (torch.randn(batch, *shape, device=device),
                torch.randint(0, width, (batch,), device=device))

    criterion = _step_loss if steps_model else task_loss(config, width, optim_device)
    key = json.dumps([config.model.name, config.model.kwargs, width, config.data.kind,
                      kind.image_sizes(config.data), config.model.activation_checkpointing,
                      config.model.freeze],
                     sort_keys=True, default=str)
    return StepSpec(build, make_batch,
                    (lambda model: lightning_optim.from_module(model)[0]) if steps_model else
                    lambda model: build_optimizer(model, config.optim, lr, optim_device),
                    criterion, target.precision, target.device, config.optim.grad_clip_norm,
                    target.capability, model_key=key, lightning_order=steps_model)


def model_info(spec: StepSpec, precision: str, config: Config | None = None) -> ModelInfo:
    model = shared_build(spec)  # only read here
    units = [sum(p.numel() for p in m.parameters()) for m in model.modules() if is_block(m)]
    total = sum(p.numel() for p in model.parameters())
    rest = total - sum(units)  # blocks nest rarely; the root unit holds the rest
    splits = _splits(model, config) if config else (0, (), (), False)
    return ModelInfo(total, sum(p.numel() for p in model.parameters() if p.requires_grad),
                     max([rest, *units]), bf16_parameters(model, precision), sum(units),
                     *splits)


def _splits(model: nn.Module, config: Config) -> tuple[int, tuple, tuple, bool]:
    """(parameters the tensor-parallel plan splits, the tensor sizes and the pipeline sizes
    the model allows, up to 8 each, whether its plan splits the sequence as an option)."""
    from hpctrain.parallel import pipeline
    from hpctrain.parallel import tensor as tensor_parallel

    p = config.parallel
    try:
        plan = tensor_parallel.plan_for(model, p.tensor_plan, p.sequence_parallel,
                                        config.model.name)
    except ConfigError:
        return 0, (), (), False
    split = {id(param): param.numel() for name in tensor_parallel.resolve(model, plan, False)
             for param in model.get_submodule(name).parameters(recurse=False)}

    def allowed(check) -> tuple[int, ...]:
        sizes = []
        for size in (2, 4, 8):
            try:
                check(size)
                sizes.append(size)
            except ConfigError:
                pass
        return tuple(sizes)

    return (sum(split.values()),
            allowed(lambda t: tensor_parallel.checked_plan(model, config, t)),
            allowed(lambda n: pipeline.check(model, n, config.model.name,
                                             pipeline.stages_per_rank(config),
                                             config.parallel.stage_split)),
            isinstance(model, GPT))


def layout_rows(footprint: Footprint, info: ModelInfo, target: Target,
                config: Config) -> dict[str, int]:
    """One device's share of the step under the target's layout."""
    rows = dict(footprint.at_peak)
    n = target.data
    layout = target.layout
    share = layout.model_share(info.parameters, info.block_parameters, info.split_parameters)
    if layout.model_parallel:
        activations = layout.activation_share(target.sequence_parallel, target.microbatches,
                                              target.schedule)
        for key in ("parameters", "gradients", "optimizer states", "weight copies"):
            rows[key] = math.ceil(rows.get(key, 0) * share)
        for key in ("activations", "temporaries"):
            rows[key] = math.ceil(rows.get(key, 0) * activations)
    if target.layout.strategy == Strategy.DDP:
        # DDP keeps every gradient in its buckets for the whole step, from the first on
        rows["gradients"] = math.ceil(info.gradient_bytes() * share)
        if not config.parallel.gradient_as_bucket_view:
            rows["gradient buckets"] = rows["gradients"]
    elif target.layout.strategy == Strategy.FSDP:
        gather_bytes = 2 if info.bf16_gather else 4
        for key in ("parameters", "gradients", "optimizer states"):
            rows[key] = math.ceil(rows[key] / n)
        if config.parallel.cpu_offload:  # shards and their optimiser live in host memory
            rows["parameters"] = rows["optimizer states"] = rows["gradients"] = 0
        if info.bf16_gather:
            rows["weight copies"] = 0  # the gathered bf16 copies replace autocast's
        rows["gathered parameters"] = math.ceil((2 * info.largest_unit if config.parallel.
                                                 reshard_after_forward else info.parameters)
                                                * gather_bytes * share)
        rows["gradient reduce buffers"] = math.ceil(info.largest_unit * 4 * share)
    return rows


def estimate(config: Config, target: Target, batch_size: int | None = None,
             footprint: Footprint | None = None) -> Estimate:
    """The estimate for `config` on `target`, at the recipe's per-device batch unless given."""
    width, note = output_width(config)
    spec = step_spec(config, target, width)
    batch = batch_size or per_device_batch(config, target.data)[0]
    footprint = footprint or predict(spec, batch)
    info = model_info(spec, target.precision, config)
    notes = [note] if note else []
    if config.data.kind_spec.any_shape and first_sample(config).note:
        notes.append(first_sample(config).note)  # your collate's: the sample it batches
    if target.device == "cuda" and config.compile is not False:
        notes.append("predicted for eager mode; torch.compile (on for GPU runs) usually "
                     "holds less, as Inductor recomputes cheap elementwise results")
    if target.device == "cuda" and any(isinstance(m, nn.modules.conv._ConvNd)
                                       for m in shared_build(spec).modules()):
        notes.append("not counted: cuDNN's convolution workspace, allocated and freed inside "
                     "each convolution (an H200 gave hpctrain:tiny_cnn at batch 256, 64 px, up "
                     "to 176 MiB of it, 1.4x the rest of its peak); --measure on the GPU sees it")
    return Estimate(config.name, config.model.name, batch, input_shape(config), target, info,
                    footprint, layout_rows(footprint, info, target, config),
                    config.model.activation_checkpointing, notes)


def with_layout(base: Estimate, config: Config, world_size: int, strategy: Strategy,
                tensor: int = 1, pipeline: int = 1) -> Estimate:
    """The same step on another layout: no new simulation. A pipeline takes the default
    micro-batches per stage and 1F1B; tensor parallelism, sequence parallelism where the
    model's plan has it."""
    target = replace(base.target,
                     layout=split_world(world_size, tensor, pipeline, strategy,
                                        f"--world-size {world_size}"),
                     sequence_parallel=tensor > 1 and base.info.sequence_parallel,
                     microbatches=MICROBATCHES_PER_STAGE * pipeline if pipeline > 1 else 1,
                     schedule="1f1b")
    return replace(base, target=target,
                   rows=layout_rows(base.footprint, base.info, target, config))
