"""Build everything a run needs from one Config and the process environment, in order:
layout checks, process group, run directory, data, model (split for tensor parallelism,
wrapped for DDP/FSDP), optimiser.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from hpctrain import user_code
from hpctrain.cluster.environment import detect, node_local_scratch
from hpctrain.cluster.records import ProcessEnv
from hpctrain.cluster.scheduler import current as scheduler
from hpctrain.config import Config, Strategy
from hpctrain.data.loader import DataBundle, build_data
from hpctrain.data.streams import Stream
from hpctrain.data.user_datasets import unknown_classes
from hpctrain.errors import ConfigError, DataError
from hpctrain.models.checkpointing import enable_activation_checkpointing
from hpctrain.models.lazy import materialise
from hpctrain.models.model_names import build_model, check_model_takes
from hpctrain.monitor.beats import STARTUP, Beats
from hpctrain.monitor.meter import Meter
from hpctrain.monitor.start import make_meter
from hpctrain.parallel import data as data_parallel
from hpctrain.parallel import pipeline, processes, tensor
from hpctrain.parallel.layout import Layout, microbatches as layout_microbatches, resolve_layout
from hpctrain.parallel.processes import Distributed
from hpctrain.report import trackers
from hpctrain.runs.directory import RunDir
from hpctrain.runs.identity import read_identity
from hpctrain.tasks import registry, tensors
from hpctrain.tasks.spec import TaskSetup
from hpctrain.tasks.steps import Batch, Task, logits_of
from hpctrain.train import compilation
from hpctrain.train.checkpoints.checkpoint import Checkpointer
from hpctrain.train.checkpoints.run_place import RunPlace, resolve_run
from hpctrain.train.hardware import fp8
from hpctrain.train.hardware.mfu import ModelFlops, model_flops
from hpctrain.train.hardware.precision import Precision
from hpctrain.train.hardware.system import SystemPlan, apply_global_switches, plan_system
from hpctrain.train.optimizers.optim import (WeightEma, build_optimizer, build_scheduler, freeze,
                                             scaled_lr)
from hpctrain.train.checkpoints.interval import Pacer, unwarned_stops
from hpctrain.train.preemption import deadline_at
from hpctrain.train.step import BatchHooks, Step
from hpctrain.train.trial import TrialLink, link
from hpctrain.train.user_functions import with_user_functions
from hpctrain.train.your_loaders import with_your_loaders
from hpctrain.train.validation import fused_eval


@dataclass
class Parts:
    """Everything the loop needs, built once."""

    config: Config
    plan: SystemPlan
    device: torch.device
    distributed: Distributed
    place: RunPlace  # the run directory, the checkpoint resumed from, what leaves its history
    data: DataBundle
    model: nn.Module  # the module whose state checkpoints hold (sharded in place under FSDP)
    step: Step  # one training step's module, optimiser, precision, stage... (train/step.py)
    task: Task  # the batch on the device, the loss, the metrics
    fp8: fp8.Fp8Plan | None  # which Linear layers compute in float8, under precision=fp8
    fused_eval: fused_eval.FusedEvaluation | None  # the model evaluated, conv+BN folded
    unfused_why: str | None  # why fuse_eval found nothing to fold where it should have
    checkpointer: Checkpointer
    meter: Meter  # this rank's GPU (or CPU energy) in the background; the loop starts it
    deadline: float | None  # Unix time at which to save and stop, or None
    pacer: Pacer | None  # when checkpoint.every=auto saves; None: its every_steps/epochs
    trial: TrialLink | None  # the search this run is a trial of (tune/), or None
    steps_per_epoch: int
    total_steps: int
    batch_size: int  # per device and micro-step
    global_batch_size: int
    effective_lr: float
    optimizer_note: str  # the optimiser and its LR, as the banner says them
    model_flops: ModelFlops  # parameters of the whole model, and its FLOPs per token
    beats: Beats  # this process's progress, which its hang watch reads (monitor/hangs.py)
    compile_cache: str | None = None  # where compiled kernels are kept, as the banner says it

    @property
    def world_size(self) -> int:
        return self.distributed.world_size

    @property
    def keep_best(self):
        """The model's own choice of the best checkpoints where a model with its own steps
        gives one (a LightningModule's ModelCheckpoint); None otherwise."""
        return self.model.keep_best if self.config.task_spec.steps_model else None

    @property
    def run_dir(self) -> Path:
        return self.place.run_dir

    @property
    def resume_from(self) -> Path | None:
        return self.place.resume_from


class _Decided(NamedTuple):
    layout: Layout
    plan: SystemPlan
    device: torch.device
    meter: Meter
    batch_size: int  # per device and micro-step
    global_batch: int
    microbatches: int  # per pipeline step (1 without a pipeline)


def _decide(config: Config, env: ProcessEnv) -> _Decided:
    """The layout, device, precision and batch, checked before any process group exists (a
    layout that cannot work is refused on every rank alike, instead of hanging)."""
    layout = resolve_layout(config, env)
    plan = plan_system(config, processes.local_device(config.device, env),
                       sharded=layout.strategy == Strategy.FSDP, staged=layout.pipeline > 1)
    device = torch.device(plan.device)
    # its first reading now: the run's energy counts from the moment the device is chosen
    meter = make_meter(device, env.hostname, config.monitor.enabled,
                           config.monitor.interval_seconds)
    batch_size, global_batch = processes.per_device_batch(config, layout.data)
    processes.check_layout(config, layout, device, plan.precision)
    check_model_takes(config.model.name, config.data.kind)
    if layout.model_parallel and not user_code.is_code_reference(config.model.name):
        _check_split(_sketch(config), config, layout)
    micro = layout_microbatches(config, layout, batch_size) if layout.pipeline > 1 else 1
    return _Decided(layout, plan, device, meter, batch_size, global_batch, micro)


def _start(config: Config, env: ProcessEnv, decided: _Decided, held: ExitStack, beats: Beats
           ) -> tuple[Config, _Decided, Distributed, RunPlace, float | None, DataBundle]:
    """The process group, the run directory (locked until `held` closes), the job's end, and
    the data (one rank per node fills the dataset cache, or makes your data first: a
    DataModule's prepare_data), with what your DataLoaders set (the configuration and the
    batch as they say, where you did not say otherwise)."""
    beats.beat(f"{STARTUP}: the process group")
    distributed = processes.start(config, env, decided.layout, decided.device)
    apply_global_switches(decided.plan, config.seed)
    beats.beat(f"{STARTUP}: the run directory")
    place = _on_rank0(distributed, lambda: resolve_run(config, env.job_id, env.restart_count))
    held.callback(place.lock.release)
    job_end = _on_rank0(distributed, lambda: scheduler().job_end_time(env.job_id, os.environ)
                        if env.job_id and config.preemption.deadline == "auto" else None)
    beats.beat(f"{STARTUP}: the data")
    with distributed.node_leader_first():
        config, decided = _with_your_loaders(config, decided, env.local_rank == 0)
        data = build_data(config.data, decided.batch_size, config.seed, decided.device,
                          distributed.data_rank, decided.layout.data, env.local_world_size,
                          (config.preemption.signal,), node_local_scratch())
    return config, decided, distributed, place, job_end, data


def _with_your_loaders(config: Config, decided: _Decided, leader: bool) \
        -> tuple[Config, _Decided]:
    """The configuration with your DataLoaders' batch sizes and workers (your_loaders.py),
    and the batch decided again from it; `leader`: the node's first process."""
    adopted = with_your_loaders(config, leader)
    if adopted is config:
        return config, decided
    layout = decided.layout
    batch_size, global_batch = processes.per_device_batch(adopted, layout.data)
    micro = layout_microbatches(adopted, layout, batch_size) if layout.pipeline > 1 else 1
    return adopted, decided._replace(batch_size=batch_size, global_batch=global_batch,
                                     microbatches=micro)


def _wrap(model: nn.Module, config: Config, layout: Layout, distributed: Distributed,
          device: torch.device, plan: SystemPlan, flops: ModelFlops):
    """(model, fp8 plan, wrapped model, plan): the tensor-parallel split, float8 layers,
    activation checkpointing, then the DDP/FSDP wrapper; compile off under a pipeline (its
    schedule calls the stage, not `forward`), else in the mode it compiles with."""
    model = tensor.split_tensors(model, distributed, config)
    fp8_plan = fp8.convert(model, config.fp8, fsdp=layout.strategy == Strategy.FSDP) \
        if plan.precision == "fp8" else None
    if config.model.activation_checkpointing:
        model = enable_activation_checkpointing(model, config.model.name)
    wrapped = data_parallel.wrap_model(model, distributed, config, device, plan.precision)
    if layout.pipeline > 1 and plan.compile:
        plan = dataclasses.replace(plan, compile=False)
    plan = compilation.with_mode(plan, config, distributed.env.world_size, flops.parameters)
    return model, fp8_plan, wrapped, plan


def _run_task(config: Config, data: DataBundle, device: torch.device, plan: SystemPlan,
              batch_size: int, layout: Layout, model: nn.Module) -> Task:
    """The task's batch handling, loss and metrics, with the user's functions; under tensor
    parallelism without loss parallelism, on logits made local first."""
    task = with_user_functions(_task(config, data, device, plan, batch_size, model),
                               config.task)
    if layout.tensor > 1 and not config.parallel.loss_parallel:
        task = tensor.local_logits(task)
    return task


def _model_on_device(config: Config, data: DataBundle, plan: SystemPlan, layout: Layout,
                     distributed: Distributed, device: torch.device) \
        -> tuple[nn.Module, ModelFlops]:
    """The model for the data's classes or vocabulary, on its device in its memory format
    (SyncBatchNorm where asked), with its FLOPs counted whole (before a pipeline cuts it)."""
    model = build_model(config.model.name, data.num_classes, config.model.kwargs,
                        vocab_size=data.vocab_size, kind=config.data.kind,
                        image_sizes=config.data.kind_spec.image_sizes(config.data),
                        pretrained=config.model.pretrained)
    if config.task_spec.check_model is not None:
        config.task_spec.check_model(model, data.vocab_size, config)
    materialise(model, lambda made: tensors.call(  # still on the CPU
        made, _first_input(config, data, torch.device("cpu"))), config.model.name)
    freeze(model, config.model.freeze)
    flops = model_flops(model)  # of the whole model: a pipeline stage holds only its part
    own, claimed = config.task_spec.own_steps, registry.claiming(model)
    if own is not None:  # the model brings its own steps: the engine steps its adapter
        model = own.adapt(model, device, distributed, data)
    elif claimed is not None:
        raise ConfigError(f"model.name {config.model.name} made {claimed.own_steps.word}, "
                          f"which trains on its own steps: set task={claimed.name} (task "
                          f"{config.task_spec.name} trains a plain torch.nn.Module)")
    model = data_parallel.convert_batchnorm(model, config, layout.strategy)
    memory_format = torch.channels_last if plan.channels_last else torch.preserve_format
    model = model.to(device=device, memory_format=memory_format)
    if user_code.is_code_reference(config.model.name):  # hpctrain's own are seeded alike
        distributed.same_weights(model)
    if layout.model_parallel:  # again on the real shapes: the sketch's vocabulary and classes
        _check_split(model, config, layout)  # were placeholders, and your own code had none
    return model, flops


def _ask_for_classes(config: Config, data: DataBundle) -> None:
    """Classes that neither the recipe nor the data says: only your own model's output can
    say them (a library's or hpctrain's model would be built with its default head)."""
    if data.num_classes is None and config.task_spec.classes_from_output and \
            not user_code.is_code_reference(config.model.name):
        raise unknown_classes(config.data.dataset, f", and model.name {config.model.name} is "
                              "built for the number it is given")


def _classes_from_output(model: nn.Module, config: Config, data: DataBundle,
                         device: torch.device) -> DataBundle:
    """Where the task takes its classes from the model (your own model, and neither the
    recipe nor the dataset names them): the width of its output on the first validation
    sample, before any wrapper (the same on every rank, no collective)."""
    if data.num_classes is not None or not config.task_spec.classes_from_output:
        return data
    training = model.training
    model.eval()
    with torch.no_grad():  # (batch, classes, ...)
        width = logits_of(tensors.call(model, _first_input(config, data, device))).shape[1]
    model.train(training)
    return dataclasses.replace(data, num_classes=int(width),
                               classes_from="the model's output width; data.num_classes unset")


def _first_input(config: Config, data: DataBundle, device: torch.device):
    """The model's input for the first validation sample, as a batch of one (made as the
    loaders make batches) on `device`."""
    kind = config.data.kind_spec
    inputs, targets = tensors.split(data.collate([
        data.val_loader.dataset[kind.sample_key(config.data, 0)]]))
    return kind.batcher(device, config.data, False)(inputs, targets)[0]


def _cut_for_pipeline(model: nn.Module, config: Config, layout: Layout, rank: int,
                      distributed: Distributed, device: torch.device, micro_batch: int):
    """This rank's stage of the model, the stages' parts it holds, and the shape of the
    stream between stages."""
    def sample(count: int) -> torch.Tensor:
        return pipeline.sample_inputs(model, config, count, device)
    stream = pipeline.stream_shape(model, layout.tensor if config.parallel.sequence_parallel
                                   else 1, lambda: sample(1))
    per_rank = pipeline.stages_per_rank(config)
    blocks = pipeline.stage_blocks(model, config.parallel.stage_split, layout.pipeline * per_rank,
                                   lambda: sample(micro_batch), distributed)
    model, stage_parts = pipeline.cut_to_stage(model, layout.coordinates(rank)[0],
                                               layout.pipeline, per_rank, blocks)
    return model, stage_parts, stream


def _pacer(config: Config, distributed: Distributed, place: RunPlace, steps_per_epoch: int,
           deadline: float | None) -> Pacer | None:
    """checkpoint.every=auto's pacer, with the run's unwarned stops so far (run.json, read on
    rank 0, and this start's: the lock of a job that died without a word, taken over);
    None otherwise."""
    if config.checkpoint.every != "auto":
        return None
    record = read_identity(place.run_dir)[0] if distributed.is_main else None
    left = deadline - time.time() if deadline is not None else None
    stops, hours, left = distributed.broadcast((*unwarned_stops(
        (record or {}).get("starts", []), now=place.lock.gone is not None), left))
    return Pacer(stops, hours, steps_per_epoch, config.checkpoint.prior_stop_hours,
                 limit=left)  # rank 0's: every rank alike


def _run_length(config: Config, data: DataBundle, global_batch: int) -> tuple[int, int]:
    """(optimiser steps per epoch, steps in the run); a stream without a length takes
    train.max_steps as its length."""
    train = config.train
    if isinstance(data.train_sampler, Stream) and data.train_sampler.batches_per_epoch is None:
        if not train.max_steps:
            raise ConfigError(f"data.dataset: {config.data.dataset} is a stream without a "
                              "length (no __len__): set train.max_steps, the run's length")
        data.train_sampler.set_run_length(train.max_steps * train.grad_accum_steps)
    steps_per_epoch = len(data.train_loader) // train.grad_accum_steps
    if steps_per_epoch == 0:
        raise DataError(f"one optimiser step needs {global_batch} samples but the training set "
                        f"has {len(data.train_loader.dataset)}; lower train.batch_size, "
                        "train.global_batch_size or train.grad_accum_steps")
    return steps_per_epoch, train.max_steps or math.ceil(train.epochs * steps_per_epoch)


def _on_rank0(distributed: Distributed, make):
    """`make()` on rank 0, its result (or its error) on every rank."""
    result = None
    if distributed.is_main:
        try:
            result = ("ok", make())
        except Exception as err:  # re-raised below, on every rank alike
            result = ("error", err)
    kind, value = distributed.broadcast(result)
    if kind == "error":
        raise value
    return value


def _fused_evaluation(model: nn.Module, config: Config, layout, plan: SystemPlan):
    """The folded evaluation (train.fuse_eval); or why there is none, where it was asked for
    or the model has batch-norms; or None."""
    setting = config.train.fuse_eval  # true with a split model: refused by check_layout
    if setting is False or layout.model_parallel or layout.strategy == Strategy.FSDP:
        return None
    folded = fused_eval.fold(model, sync_buffers=layout.strategy == Strategy.DDP,
                             compile_mode=plan.compile_mode if plan.compile else None)
    if isinstance(folded, str) and setting == "auto" and "no BatchNorm2d" in folded:
        return None  # nothing to fold, nothing to say
    return folded


def _task(config: Config, data: DataBundle, device: torch.device, plan: SystemPlan,
          batch_size: int, model: nn.Module | None = None) -> Task:
    return config.task_spec.build(TaskSetup(config, device, data.num_classes, data.answer,
                                            batch_size, plan.channels_last, model))


def _optimizer(model: nn.Module, config: Config, distributed: Distributed, place: RunPlace,
               device: torch.device, global_batch: int, steps_per_epoch: int,
               total_steps: int) -> tuple:
    """(optimiser, schedule, its first LR, the banner's words for them): hpctrain's from
    optim.* and schedule.*, the LR scaled to the global batch; or a LightningModule's own."""
    if config.task_spec.own_steps is not None:
        optimizer, scheduler = config.task_spec.own_steps.optimizer(
            model, config, _position(config, distributed, place, steps_per_epoch, total_steps))
        return optimizer, scheduler, optimizer.param_groups[0]["lr"], scheduler.describe()
    lr = scaled_lr(config.optim, global_batch)
    optimizer = build_optimizer(model, config.optim, lr, device)
    scheduler = build_scheduler(optimizer, config.schedule, total_steps, steps_per_epoch)
    return optimizer, scheduler, lr, \
        f"{config.optim.name} effective lr {lr:.4g} ({config.optim.lr_scaling} scaling)"


def _position(config: Config, distributed: Distributed, place: RunPlace, steps_per_epoch: int,
              total_steps: int) -> dict:
    """The run's length, ranks and folder, by name, where a model with its own steps reads
    them (a LightningModule's `self.trainer`)."""
    env = distributed.env
    return dict(
        steps_per_epoch=steps_per_epoch, accumulate=config.train.grad_accum_steps,
        total_steps=total_steps, world_size=env.world_size, rank=env.rank,
        local_rank=env.local_rank, local_world_size=env.local_world_size,
        num_nodes=env.num_nodes, run_dir=place.run_dir,
        eval_every_epochs=config.train.eval_every_epochs)


def _check_split(model: nn.Module, config: Config, layout) -> None:
    if layout.pipeline > 1:
        pipeline.check(model, layout.pipeline, config.model.name,
                       pipeline.stages_per_rank(config), config.parallel.stage_split)
        pipeline.schedule_class(config.parallel.schedule)
    if layout.tensor > 1:
        tensor.checked_plan(model, config, layout.tensor)


def _sketch(config: Config) -> nn.Module:
    """The model on the meta device (no memory, no data needed): its shape, to check a
    tensor-parallel split before any process group exists."""
    kind = config.data.kind_spec
    with torch.device("meta"):
        return build_model(config.model.name, None if kind.vocabulary else 10,
                           config.model.kwargs, vocab_size=256 if kind.vocabulary else None,
                           kind=kind.name, image_sizes=kind.image_sizes(config.data))


def _training_step(config: Config, layout: Layout, distributed: Distributed, plan: SystemPlan,
                   device: torch.device, model: nn.Module, forward: nn.Module, task: Task,
                   optimizer, scheduler, stages: pipeline.Pipeline | None,
                   fp8_plan: fp8.Fp8Plan | None) -> Step:
    """The engine's Step (train/step.py): the module the step calls (`forward`: wrapped,
    compiled), the task's move and loss, precision with the clipping that spans this run's
    model copy, the optimiser and schedule, EMA of `model`, the pipeline's schedule, and the
    wrapper's and the tensor plan's contexts."""
    return Step(
        model=forward, params=[p for p in model.parameters() if p.requires_grad],
        to_device=functools.partial(task.to_device, training=True), loss=task.loss,
        precision=Precision(plan.precision, device,
                            distributed.clip_function(stages.copies if stages else ()),
                            fp8.after_step(model, fp8_plan)),
        optimizer=optimizer, clip_norm=config.optim.grad_clip_norm,
        accumulate=config.train.grad_accum_steps, scheduler=scheduler,
        ema=WeightEma(model, config.optim.ema.decay) if config.optim.ema.enabled else None,
        pipeline=stages, gradient_sync=data_parallel.gradient_sync(forward),
        loss_context=tensor.loss_context(config, layout),
        hooks=BatchHooks(**model.batch_hooks(optimizer)) if config.task_spec.steps_model
        else None)


def build_parts(config: Config, env: ProcessEnv | None = None,
                held: ExitStack | None = None, beats: Beats | None = None) -> Parts:
    """All parts of a run; `env` defaults to the environment this process was started in.
    What the run holds until it ends (its run directory's lock) is released by `held`'s close,
    built or not; without `held` (a test or benchmark driving the parts itself), once built.
    `beats`: the progress the run's hang watch reads (each stage of the build beats it)."""
    beats = beats or Beats()
    if held is None:
        with ExitStack() as for_the_build:
            parts = build_parts(config, env, for_the_build, beats)
            parts.place.lock.keep_folders()  # the caller's steps write into the run directory
            return parts
    env = env or detect()
    trackers.check(config)  # a tracker's missing library, said before anything is built
    config, decided, distributed, place, job_end, data = _start(
        config, env, _decide(config, env), held, beats)
    layout, plan, device, meter, batch_size, global_batch, micro = decided
    beats.beat(f"{STARTUP}: the model")

    # ---- the model, then its distributed wrapper ----
    _ask_for_classes(config, data)
    model, flops = _model_on_device(config, data, plan, layout, distributed, device)
    data = _classes_from_output(model, config, data, device)
    stream = stage_parts = stages = None
    if layout.pipeline > 1:
        model, stage_parts, stream = _cut_for_pipeline(model, config, layout, env.rank,
                                                       distributed, device, batch_size // micro)
    model, fp8_plan, wrapped, plan = _wrap(model, config, layout, distributed, device, plan, flops)
    kept = compilation.keep_cache(config.compile_cache, place.run_dir, device, held) \
        if plan.compile else None  # before torch.compile, which reads the folder
    forward = compilation.compiled(model, wrapped, config, plan)
    folded = _fused_evaluation(model, config, layout, plan)

    # ---- the run's length, the task, the optimiser and schedule ----
    steps_per_epoch, total_steps = _run_length(config, data, global_batch)
    task = _run_task(config, data, device, plan, batch_size, layout, model)
    if layout.pipeline > 1:
        stages = pipeline.build(
            wrapped, stage_parts,
            lambda outputs, targets: task.loss(outputs, Batch(None, targets, targets)),
            layout, env.rank, device, config.parallel.schedule, micro,
            distributed.mesh["pipeline"].get_group(), stream)
    optimizer, scheduler, lr, note = _optimizer(model, config, distributed, place, device,
                                                global_batch, steps_per_epoch, total_steps)
    step = _training_step(config, layout, distributed, plan, device, model, forward, task,
                          optimizer, scheduler, stages, fp8_plan)
    deadline = deadline_at(config.preemption, job_end)
    return Parts(
        config=config, plan=plan, device=device, distributed=distributed, place=place,
        data=data, model=model, step=step, task=task,
        fp8=fp8_plan, fused_eval=None if isinstance(folded, str) else folded,
        unfused_why=folded if isinstance(folded, str) else None,
        checkpointer=Checkpointer(RunDir(place.run_dir).checkpoints, config.checkpoint.keep_last,
                                  distributed, config.checkpoint.async_save),
        meter=meter, deadline=deadline,
        pacer=_pacer(config, distributed, place, steps_per_epoch, deadline),
        trial=link(config, distributed),
        steps_per_epoch=steps_per_epoch, total_steps=total_steps, batch_size=batch_size,
        global_batch_size=global_batch, effective_lr=lr, optimizer_note=note,
        model_flops=flops, beats=beats, compile_cache=kept)
