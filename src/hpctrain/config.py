"""The recipe schema, YAML loading, `key=value` overrides and validation.

One resolved `Config` is the single source of truth for a run: every feature is a field here,
consumed in exactly one place. Validation errors name the key, the value given and what is
allowed, and surface as `ConfigError` (exit code 2).
"""

from __future__ import annotations

import difflib
import signal
from datetime import datetime
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from hpctrain import user_code
from hpctrain.tasks import registry as tasks
from hpctrain.errors import ConfigError

Auto = Literal["auto"]


class Section(BaseModel):
    # inf and nan are never meant: train.epochs=.inf would train forever
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def plain_name(value: str | None, what: str) -> str | None:
    """A name that becomes one folder inside output_dir: no path, nothing hidden."""
    if value is None:
        return value
    if not value or value in (".", "..") or any(c in value for c in "/\\\0") or \
            value.startswith(".") or any(ord(c) < 32 for c in value):
        raise ValueError(f"{value!r} is not a plain name: {what} names a folder inside "
                         "output_dir, so it may not hold '/', start with '.' or be empty")
    return value


class ShapesConfig(Section):
    num_train: int = Field(10000, ge=10)
    num_val: int = Field(2000, ge=10)
    image_size: int = Field(32, ge=8, le=512)
    seed: int = 0
    cache_dir: str = Field("~/.cache/hpctrain",
                           description="where the generated dataset is kept between runs")


class SyntheticConfig(Section):
    num_train: int = Field(2560, ge=1)
    num_val: int = Field(512, ge=1)
    num_classes: int = Field(1000, ge=2)


class TokensConfig(Section):
    """Language-model data: how a token pack becomes samples."""

    seq_len: int = Field(256, ge=2, description="tokens a sample feeds the model (its "
                         "context length in training)")
    batching: Literal["blocks", "documents"] = Field(
        "blocks", description="blocks: the corpus as one stream cut into seq_len blocks (no "
        "padding); documents: one sample per document, batched by length and padded per batch")
    bucket_pool_batches: int = Field(50, ge=1, description="documents: batches sorted by "
                                     "length together (more: less padding, less randomness)")
    vocab_size: int | None = Field(None, ge=2, description="your own token data: its "
                                   "vocabulary (None: the training dataset's vocab_size)")


class ArithmeticConfig(Section):
    """The built-in corpus of sums and differences (data.dataset=arithmetic)."""

    num_train: int = Field(200_000, ge=10, description="training documents (problems, drawn "
                           "with repeats from those not held out)")
    num_val: int = Field(2000, ge=10, description="distinct held-out problems")
    max_operand: int = Field(99, ge=2, le=999, description="every problem up to it is "
                             "written out once: 999 makes 1 M per operation")
    operations: str = Field("+-", pattern=r"^[+*-]+$")
    seed: int = 0
    cache_dir: str = Field("~/.cache/hpctrain",
                           description="where the generated corpus is kept between runs")


class Shapes3dConfig(Section):
    """The built-in point clouds of 3D primitives (data.dataset=shapes3d)."""

    num_train: int = Field(5000, ge=10)
    num_val: int = Field(1000, ge=10)
    seed: int = 0
    cache_dir: str = Field("~/.cache/hpctrain",
                           description="where the generated dataset is kept between runs")


class PointsConfig(Section):
    """Point-cloud data: the points per cloud, and how training perturbs the clouds (on the
    device, each cloud drawn anew)."""

    num_points: int = Field(1024, ge=16, description="points per cloud fed to the model")
    up_axis: Literal["auto", "x", "y", "z"] = Field(
        "auto", description="the axis rotations turn about; auto: y for ModelNet's HDF5 "
        "files (PointNet's convention), z otherwise")
    rotate: bool = Field(True, description="turn each cloud by a random angle about the up "
                         "axis")
    scale: tuple[float, float] = Field((0.8, 1.25), description="each cloud scaled by a "
                                       "factor drawn from this range")
    jitter_sigma: float = Field(0.01, ge=0, description="Gaussian noise on every point")
    jitter_clip: float = Field(0.05, gt=0)
    dropout_max: float = Field(0.875, ge=0, lt=1, description="each cloud loses a random "
                               "share of its points up to this (replaced by its first point)")
    cache_dir: str = Field("~/.cache/hpctrain", description="ModelNet meshes: where their "
                           "sampled clouds are kept between runs")

    @model_validator(mode="after")
    def _scale_range(self):
        lo, hi = self.scale
        if not 0 < lo <= hi:
            raise ValueError(f"scale must satisfy 0 < min <= max, got {self.scale}")
        return self


class AugmentConfig(Section):
    random_resized_crop: bool = True
    crop_scale: tuple[float, float] = (0.08, 1.0)
    hflip: bool = True
    mixup_alpha: float = Field(0.0, ge=0, description="mixup's Beta(alpha, alpha); 0: off "
                               "(0.2 is usual)")
    cutmix_alpha: float = Field(0.0, ge=0, description="CutMix's Beta(alpha, alpha); 0: off "
                                "(1.0 is usual)")
    mix_prob: float = Field(1.0, ge=0, le=1, description="share of batches mixed")
    mix_switch_prob: float = Field(0.5, ge=0, le=1, description="with both on: share of "
                                   "mixed batches that use CutMix")

    @model_validator(mode="after")
    def _scale_range(self):
        lo, hi = self.crop_scale
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < min <= max <= 1, got {self.crop_scale}")
        return self


class ProgressiveConfig(Section):
    """FFCV-style progressive resizing: train size grows linearly from start to end size."""

    enabled: bool = False
    start_size: int = Field(160, ge=8)
    end_size: int = Field(192, ge=8)
    start_epoch: int = Field(0, ge=0)
    end_epoch: int = Field(10, ge=1)
    multiple_of: int = Field(32, ge=1)


BUILTIN_DATASETS = ("shapes", "imagefolder", "shards", "synthetic", "tokens", "arithmetic",
                    "shapes3d", "modelnet")


class DataConfig(Section):
    dataset: str = Field("shapes", description=f"{', '.join(BUILTIN_DATASETS)}, or your own "
                         "factory returning (train, val) Datasets: package.module:make or "
                         "path/to/file.py:make (a relative path is read from the recipe's "
                         "folder)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="your dataset factory's "
                                   "keyword arguments")
    path: str | None = Field(None, description="imagefolder: its root (with train/ and val/, "
                                               "or class folders and a val_fraction); shards: "
                                               "the folder written by hpctrain pack; tokens: "
                                               "the one written by hpctrain pack --tokens; "
                                               "modelnet: ModelNet's .off class folders or "
                                               "HDF5 files")
    decode: Literal["cpu", "gpu"] = Field("cpu", description="shards: where JPEGs are "
                                          "decoded; gpu: batched nvJPEG on the device")
    cache: str = Field("off", description="shards: copy the pack once per node to local "
                       "storage: auto (the job's scratch folder, else $TMPDIR), a path, or off")
    num_classes: int | None = Field(None, ge=1, description="expected number of classes, "
                                    "checked against the data (None: take the data's)")
    val_fraction: float | None = Field(None, gt=0, lt=1)
    image_size: int = Field(32, ge=8, le=1024)
    val_image_size: int | None = Field(None, ge=8, le=1024)
    val_resize_ratio: float = Field(1.0, gt=0, le=1,
                                    description="crop fraction for validation (0.875 for "
                                                "ImageNet; 1 = resize only)")
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    num_workers: int | Auto = "auto"
    prefetch_factor: int = Field(4, ge=1)
    persistent_workers: bool = True
    worker_start: Literal["auto", "fork", "forkserver", "spawn"] = Field(
        "auto", description="how DataLoader workers start; auto: Python's default (fork on "
        "Linux before 3.14), spawn or forkserver for code that must not be forked")
    pin_memory: bool | Auto = "auto"
    loader: Literal["auto", "buffers", "torch"] = Field(
        "auto", description="buffers: workers write each sample straight into batch buffers "
        "in shared memory, reused every step (data/batch_buffers.py); torch: torch's "
        "DataLoader; auto: buffers for packs and image folders decoded on the CPU")
    on_bad_image: Literal["skip", "fail"] = "skip"
    augment: AugmentConfig = AugmentConfig()
    progressive: ProgressiveConfig = ProgressiveConfig()
    shapes: ShapesConfig = ShapesConfig()
    synthetic: SyntheticConfig = SyntheticConfig()
    tokens: TokensConfig = TokensConfig()
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    points: PointsConfig = PointsConfig()
    shapes3d: Shapes3dConfig = Shapes3dConfig()

    _kind_of_user_data: str = PrivateAttr("images")  # set by Config, from the task

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if value in BUILTIN_DATASETS or user_code.is_code_reference(value):
            return value
        hint = difflib.get_close_matches(value, BUILTIN_DATASETS, n=1)
        raise ValueError(f"expected one of {', '.join(BUILTIN_DATASETS)}"
                         + (f" (did you mean {hint[0]!r}?)" if hint else "")
                         + ", or your own factory: package.module:make or path/to/file.py:make")

    @property
    def from_user_code(self) -> bool:
        return user_code.is_code_reference(self.dataset)

    @property
    def kind(self) -> str:
        """What the samples are: images, tokens or points (your own data: what the task
        learns from, images unless `task` says otherwise)."""
        if self.from_user_code:
            return self._kind_of_user_data
        if self.dataset in TOKEN_DATASETS:
            return "tokens"
        return "points" if self.dataset in POINT_DATASETS else "images"

    @model_validator(mode="after")
    def _needs_path(self):
        if self.dataset in ("imagefolder", "shards", "tokens", "modelnet") and not self.path:
            raise ValueError(f"dataset '{self.dataset}' needs data.path (for example "
                             "data.path=/scratch/imagenet)")
        for name, value, off in (("decode", self.decode, "cpu"), ("cache", self.cache, "off")):
            if value != off and self.dataset != "shards":
                raise ValueError(f"data.{name}={value} applies to dataset 'shards' only (this "
                                 f"recipe reads '{self.dataset}'); pack it with hpctrain pack, "
                                 f"or set data.{name}={off}")
        if isinstance(self.num_workers, int) and self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 or 'auto', got {self.num_workers}")
        return self


TOKEN_DATASETS = ("tokens", "arithmetic")
POINT_DATASETS = ("shapes3d", "modelnet")


class TaskConfig(Section):
    """What is learned from the data; `task: NAME` in a recipe is short for `task.name`."""

    name: Literal[("auto", *tasks.NAMES)] = Field(
        "auto", description="auto: from data.dataset (token data: language_modeling, point "
        "clouds: point_cloud_classification, images: image_classification)")
    loss: str | None = Field(None, description="your own loss instead of the task's: "
                             "module:fn or path/to/file.py:fn, fn(outputs, targets) -> a 0-d "
                             "tensor")
    metrics: dict[str, str] = Field(default_factory=dict, description="your own metrics: "
                                    "name -> module:fn, fn(outputs, labels) -> the batch's "
                                    "sum; reported per sample as name and val_name")

    @field_validator("loss")
    @classmethod
    def _loss_is_code(cls, value):
        if value is not None and not user_code.is_code_reference(value):
            raise ValueError("expected your own function: package.module:fn or "
                             "path/to/file.py:fn")
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics_are_code(cls, value: dict):
        for name, reference in value.items():
            if not name.isidentifier() or name in RESERVED_METRICS:
                raise ValueError(f"metric name {name!r}: use a Python identifier other than "
                                 f"{', '.join(RESERVED_METRICS)}")
            if not user_code.is_code_reference(reference):
                raise ValueError(f"metric {name}: {reference!r} is not package.module:fn or "
                                 "path/to/file.py:fn")
        return value


RESERVED_METRICS = ("loss", "accuracy", "perplexity", "padding_fraction", "answer_accuracy",
                    "lr", "epoch", "step")


class ModelConfig(Section):
    name: str = Field("hpctrain:resnet_small",
                      description="torchvision:NAME, timm:NAME, hpctrain:NAME, hf:PATH, or "
                      "your own factory: package.module:build or path/to/file.py:build (a "
                      "relative path is read from the recipe's folder)")
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="extra keyword arguments for the constructor")
    activation_checkpointing: bool = False


class EmaConfig(Section):
    enabled: bool = False
    decay: float = Field(0.999, gt=0, lt=1)


class OptimConfig(Section):
    name: Literal["sgd", "adamw", "lars", "lamb"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(5e-5, ge=0)
    no_decay_norm_bias: bool = True
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    reference_batch_size: int = Field(256, ge=1)
    grad_clip_norm: float | None = Field(None, gt=0)
    ema: EmaConfig = EmaConfig()


class ScheduleConfig(Section):
    name: Literal["cosine", "step", "onecycle", "constant"] = "cosine"
    warmup_epochs: float = Field(0.0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    milestones: list[float] = Field(default_factory=lambda: [30, 60, 80],
                                    description="epochs at which 'step' multiplies by gamma")
    gamma: float = Field(0.1, gt=0, le=1)
    pct_start: float = Field(0.25, gt=0, lt=1, description="'onecycle' rising fraction")


class TrainConfig(Section):
    epochs: float = Field(10, gt=0)
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimiser "
                                                          "steps (overrides epochs)")
    batch_size: int = Field(128, ge=1, description="per-device micro-batch")
    global_batch_size: int | None = Field(
        None, ge=1, description="when set, fixes the samples per optimiser step whatever the "
        "number of processes: batch_size becomes global / (processes x grad_accum_steps). "
        "A train.batch_size override replaces a recipe's global_batch_size")
    grad_accum_steps: int = Field(1, ge=1)
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    log_every: int = Field(20, ge=1, description="optimiser steps between metric read-backs")
    eval_every_epochs: float = Field(1, gt=0)
    fuse_eval: bool | Auto = Field(
        "auto", description="evaluate with each batch-norm folded into the convolution before "
        "it (train/fused_eval.py); auto: where the model has such pairs, traces with torch.fx "
        "and is whole on each process (not FSDP, tensor or pipeline parallel)")
    nan_patience: int = Field(2, ge=1, description="stop after this many logging intervals "
                                                   "in a row with only non-finite losses")


class CheckpointConfig(Section):
    every_steps: int | None = Field(None, ge=1)
    every_epochs: float | None = Field(1, gt=0)
    keep_last: int = Field(3, ge=1)
    async_save: bool = Field(False, description="write in the background while training "
                                                "goes on (the state is copied to host first)")


class Strategy(str, Enum):
    """How the data dimension holds the model: the closed set of names, compared as members
    everywhere (parallel/layout.py decides which one a run gets)."""

    NONE = "none"  # one data-parallel copy: nothing to synchronise
    DDP = "ddp"  # a whole copy per process, gradients all-reduced
    FSDP = "fsdp"  # parameters, gradients and optimiser state sharded (FSDP2)

    def __str__(self) -> str:
        return self.value


class ParallelConfig(Section):
    data: int | Auto = Field("auto", description="processes in the data dimension (each a "
                             "share of the batch); auto: the world size / (tensor x pipeline)")
    tensor: int = Field(1, ge=1, description="processes that split each layer's matrices "
                        "(tensor parallelism, within one node)")
    pipeline: int = Field(1, ge=1, description="processes that each hold a run of the "
                          "model's blocks (pipeline parallelism)")
    strategy: Literal[("auto", *(member.value for member in Strategy))] = Field(
        "auto", description="the data dimension: auto is ddp with more than one process and "
        "only data parallelism, fsdp with tensor or pipeline parallelism, none with one")
    microbatches: int | Auto = Field("auto", description="pipeline parallelism: micro-batches "
                                     "per step (each rank's batch is split into them); auto: "
                                     "4 x parallel.pipeline, or the most that divide the batch")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"] = Field(
        "1f1b", description="pipeline parallelism: gpipe runs every micro-batch's forward, then "
        "every backward; 1f1b alternates, holding fewer micro-batches' activations; "
        "interleaved-1f1b and zero-bubble give each rank several stages (a smaller bubble), "
        "zero-bubble computes weight gradients apart to fill what is left")
    stage_split: Literal["equal", "parameters", "time"] = Field(
        "equal", description="pipeline parallelism: where the blocks are cut; equal runs, or "
        "runs balanced by the parameters (the embedding and the head count too) or by each "
        "block's measured forward and backward time")
    stages_per_rank: int | Auto = Field("auto", description="pipeline stages each rank holds "
                                        "(looped schedules); auto: 2 for interleaved-1f1b and "
                                        "zero-bubble, 1 otherwise")
    sequence_parallel: bool = Field(False, description="tensor parallelism: the norms and the "
                                    "residual stream split over the sequence too (less memory "
                                    "for activations)")
    loss_parallel: bool = Field(False, description="tensor parallelism (the GPT's plan): the "
                                "logits stay split over the vocabulary and the loss is computed "
                                "on the shares, never gathering the whole logits")
    tensor_plan: dict[str, Literal["colwise", "rowwise"]] = Field(
        default_factory=dict, description="tensor parallelism for a model without a built-in "
        "plan: module-name patterns (fnmatch, e.g. 'layers.*.fc1') -> colwise or rowwise")

    @field_validator("data", "microbatches", "stages_per_rank")
    @classmethod
    def _at_least_one(cls, value):
        if value != "auto" and value < 1:
            raise ValueError(f"{value} is too few: give 1 or more, or auto")
        return value
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    timeout_seconds: float = Field(600, gt=0, description="how long a collective may wait "
                                                          "for the other ranks")
    bucket_cap_mb: float = Field(25, gt=0, description="DDP gradient bucket size")
    gradient_as_bucket_view: bool = True
    static_graph: bool = Field(False, description="DDP: the same parameters are used every "
                                                  "step (lets DDP skip per-step bookkeeping)")
    sync_batchnorm: bool = False
    reshard_after_forward: bool = Field(True, description="FSDP: free gathered parameters "
                                                          "after forward (ZeRO-3); false: ZeRO-2")
    cpu_offload: bool = Field(False, description="FSDP: keep sharded parameters and optimiser "
                                                 "state in host memory")


class PreemptionConfig(Section):
    signal: str = Field("SIGUSR1", description="the signal that asks for a save-and-requeue; "
                                               "SIGTERM is always handled too")
    requeue: Literal["auto", "never"] = Field(
        "auto", description="auto: under Slurm, rank 0 runs 'scontrol requeue' after saving")
    deadline: Literal["auto"] | float | None = Field(
        "auto", description="save and stop this long before the end: 'auto' reads the Slurm "
        "job's end time; or a time (ISO 8601, local unless it says otherwise, or Unix "
        "seconds); or null")
    deadline_margin_seconds: float = Field(300, ge=0)
    max_requeues: int = Field(20, ge=0, description="stop requeueing a Slurm job after this "
                                                    "many restarts")

    @field_validator("deadline", mode="before")
    @classmethod
    def _as_unix_time(cls, value):
        if isinstance(value, datetime):  # YAML reads an unquoted ISO time as a datetime
            return value.timestamp()
        if isinstance(value, str) and value != "auto":
            try:
                return float(value)
            except ValueError:
                pass
            try:
                return datetime.fromisoformat(value).timestamp()
            except ValueError:
                raise ValueError(f"{value!r} is not a time: give Unix seconds, an ISO time "
                                 "such as 2026-11-22T18:00, 'auto' or null") from None
        return value

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
        if not hasattr(signal, name) or name in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"{value!r} is not a signal that can be caught; use e.g. SIGUSR1")
        return name


class TrackingConfig(Section):
    """Where the run's telemetry goes besides metrics.jsonl (report/trackers.py)."""

    sinks: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=lambda: ["tensorboard"], description="mlflow and wandb are extras "
        "(pip install 'hpctrain[mlflow]' / 'hpctrain[wandb]')")
    mlflow_uri: str | None = Field(None, description="an MLflow tracking URI; default: a file "
                                   "store in output_dir/mlruns")
    experiment: str | None = Field(None, description="MLflow experiment / W&B project "
                                   "(default: the recipe's name)")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline", description="offline: compute nodes have no internet; sync later with "
        "hpctrain runs sync RUN or wandb sync")

    @field_validator("sinks")
    @classmethod
    def _once_each(cls, value):
        return list(dict.fromkeys(value))


class MonitorConfig(Section):
    """What each rank samples in the background (monitor/): its GPU, or the CPU's energy."""

    enabled: bool = Field(True, description="sample GPU use and energy (NVML, else RAPL)")
    interval_seconds: float = Field(1.0, ge=0.05, le=60, description="between two samples")
    low_utilization: float = Field(0.5, ge=0, le=1, description="the watchdog warns when GPU "
                                   "utilisation stays under this ...")
    low_intervals: int = Field(3, ge=1, description="... for this many logging intervals")


class Fp8Config(Section):
    """precision=fp8 (train/fp8.py): which Linear layers compute in float8, and how their
    tensors are scaled. The rest of the model runs under bf16 autocast."""

    scaling: Literal["tensorwise", "rowwise"] = Field(
        "tensorwise", description="one scale per tensor (fastest; FSDP gathers weights in "
        "float8) or per row (more accurate, for models that diverge with tensorwise)")
    layers: Literal["auto", "all"] = Field(
        "auto", description="auto: only layers large enough to gain on an H100; all: every "
        "Linear whose dimensions are multiples of 16")
    skip: list[str] = Field(default_factory=list, description="name fragments of layers kept "
                            "in bf16, e.g. [attention]")
    output_layer: bool = Field(False, description="convert the last Linear (the logits) too")


class TrialConfig(Section):
    """This run is one trial of a search (`hpctrain tune`, tune/): its evaluations go to the
    study, which may stop it early (pruning). Written by the tune worker, not by hand."""

    study_dir: str | None = Field(None, description="the search's folder (its tune.json names "
                                  "the study, its storage and the metric reported)")
    number: int | None = Field(None, ge=0, description="the trial's number in the study")


class Config(Section):
    name: str = "default"
    seed: int = Field(0, ge=0, le=2**32 - 1, description="numpy takes seeds below 2**32")
    output_dir: str = Field("runs", min_length=1)
    run_name: str | None = None
    resume: str | None = Field(None, description="'auto', a run directory or a checkpoint")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    precision: Literal["auto", "fp32", "tf32", "fp16", "bf16", "fp8"] = "auto"
    channels_last: bool | Auto = "auto"
    compile: bool | Auto = "auto"
    compile_mode: Literal["default", "reduce-overhead", "max-autotune",
                          "max-autotune-no-cudagraphs"] = "default"
    cudnn_benchmark: bool | Auto = "auto"
    deterministic: bool = False
    report: bool = Field(True, description="write report.html (and its PNGs) into the run "
                         "directory when the run ends")
    task: TaskConfig = TaskConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    parallel: ParallelConfig = ParallelConfig()
    preemption: PreemptionConfig = PreemptionConfig()
    monitor: MonitorConfig = MonitorConfig()
    tracking: TrackingConfig = TrackingConfig()
    fp8: Fp8Config = Fp8Config()
    trial: TrialConfig = TrialConfig()

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_shorthand(cls, data):
        """`tensorboard=false` (or true): TensorBoard out of (or into) tracking.sinks."""
        if not isinstance(data, dict) or "tensorboard" not in data:
            return data
        data = dict(data)
        wanted = data.pop("tensorboard")
        tracking = dict(data.get("tracking") or {})
        sinks = [s for s in tracking.get("sinks", ["tensorboard"]) if s != "tensorboard"]
        tracking["sinks"] = (["tensorboard"] if wanted else []) + sinks
        data["tracking"] = tracking
        return data

    @field_validator("task", mode="before")
    @classmethod
    def _task_name(cls, value):
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _task_fits_data(self):
        task = self.task.name
        if self.data.from_user_code:
            kind = tasks.KIND_OF_TASK.get(task, "images")
            if kind == "tokens" and self.data.tokens.batching != "blocks":
                raise ValueError(f"data.dataset={self.data.dataset}: your own token data comes "
                                 "as blocks of data.tokens.seq_len + 1 ids; "
                                 "data.tokens.batching=documents reads a token pack's "
                                 "documents: set data.tokens.batching=blocks")
            self.data._kind_of_user_data = kind
            return self
        if task != "auto" and task != tasks.TASK_OF_DATA[self.data.kind]:
            raise ValueError(f"task {task} cannot learn from data.dataset={self.data.dataset} "
                             f"({self.data.kind}); use task=auto, or data that fits the task")
        return self

    @property
    def task_name(self) -> str:
        """The task, `auto` resolved from the data."""
        return self.task_spec.name

    @property
    def task_spec(self) -> tasks.TaskSpec:
        """What the task is (tasks/registry.py), `auto` resolved from the data."""
        return tasks.for_data(self.data.kind) if self.task.name == "auto" else \
            tasks.spec(self.task.name)

    @field_validator("name", "run_name")
    @classmethod
    def _one_folder(cls, value, info):
        what = "run_name" if info.field_name == "run_name" else "a recipe's name (its runs' prefix)"
        return plain_name(value, what)


# ---------------------------------------------------------------------------------------------
# Loading


def shipped_recipes() -> dict[str, Path]:
    """Name -> path of the recipes shipped inside the package."""
    folder = resources.files("hpctrain") / "recipes"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def _recipe_path(recipe: str) -> Path:
    path = Path(recipe).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"recipe file {recipe!r} does not exist")
        return path
    shipped = shipped_recipes()
    if recipe in shipped:
        return shipped[recipe]
    hint = difflib.get_close_matches(recipe, shipped, n=1)
    raise ConfigError(
        f"unknown recipe {recipe!r}: not a file and not a shipped recipe"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
        + f". Shipped recipes: {', '.join(sorted(shipped))}; or give a path to a .yaml file.")


def read_yaml_mapping(path: Path, what: str = "a recipe") -> dict:
    """A YAML file that must hold a mapping (a recipe, cluster profiles), or a ConfigError.
    An empty file is refused: a recipe saved before it was written would train the defaults."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); "
                          f"{what} is a YAML text file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    if data is None:
        raise ConfigError(f"{path} is empty (or only comments): {what} holds at least one "
                          "setting")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what} must be a mapping of keys, got "
                          f"{type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value), the value parsed as YAML (so 1e-3, true, [1,2])."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form key=value "
                          "(for example train.batch_size=256)")
    try:
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _set_dotted(tree: dict, keys: list[str], value: Any, text: str) -> None:
    node = tree
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {text!r}: {'.'.join(keys[:i + 1])} is a value, "
                              "not a section")
        node = child
    node[keys[-1]] = value


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            keys += _known_keys(sub, prefix + name + ".")
    return keys


def _explain(err: ValidationError, source: str) -> ConfigError:
    """Turn pydantic's report into one line per problem: key, value given, what is allowed."""
    lines = []
    known = _known_keys(Config)
    for problem in err.errors():
        # pydantic adds the union member ('int', 'literal[...]') to the location: drop those
        loc = [str(p) for p in problem["loc"]]
        loc = [p for p in loc if not (p.startswith(("literal[", "function-")) or p in
                                      ("int", "bool", "str", "float"))]
        key = ".".join(loc) or "(recipe)"
        if problem["type"] == "extra_forbidden":
            hint = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            lines.append(f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint
                                                    else ""))
            continue
        value = problem.get("input")
        allowed = problem["msg"]
        expected = problem.get("ctx", {}).get("expected")
        if expected:
            allowed = f"expected {expected}"
        shown = "" if isinstance(value, dict) else f" = {value!r}"
        lines.append(f"{key}{shown}: {allowed}")
    return ConfigError(f"invalid configuration ({source}):\n  " + "\n  ".join(lines))


CODE_KEYS = ("model.name", "data.dataset", "task.loss", "task.metrics.*")  # may name user
# code (user_code.py); ".*": every value of that mapping


def _code_slots(tree: dict):
    """(section, name, recipe key) of every CODE_KEYS place in a recipe's tree."""
    for key in CODE_KEYS:
        *parents, leaf = key.split(".")
        section = tree
        for part in parents:
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict):
            for name in (list(section) if leaf == "*" else [leaf]):
                yield section, name, ".".join([*parents, name])


def code_references(config: "Config") -> list[tuple[str, str]]:
    """(recipe key, reference) for every piece of user code the configuration names."""
    return [(key, section[name]) for section, name, key in _code_slots(config.model_dump())
            if isinstance(section.get(name), str) and
            user_code.is_code_reference(section[name])]


def _absolute_code_paths(tree: dict, folder: Path) -> None:
    """A `file.py:name` in the recipe is read from the recipe's folder (on the command line,
    from the current directory), and kept absolute from here on."""
    for section, name, _ in _code_slots(tree):
        if isinstance(section.get(name), str):
            section[name] = user_code.absolute(section[name], folder)


def load_config(recipe: str | Path | None = None, overrides: list[str] = (),
                settings: dict | None = None) -> Config:
    """Resolve a recipe (path or shipped name, default 'default'), then `settings` (Python
    values, nested {"train": {"epochs": 3}} or dotted {"train.epochs": 3}), then overrides
    (`key=value` text, as on the command line): the later wins."""
    path = _recipe_path(str(recipe or "default"))
    tree = read_yaml_mapping(path)
    tree.setdefault("name", path.stem)
    _absolute_code_paths(tree, path.parent)
    return _validated(tree, _changes(settings, overrides), f"recipe {path}")


def from_defaults(overrides: list[str] = (), settings: dict | None = None) -> Config:
    """hpctrain's defaults (the fields' own, no recipe), then settings and overrides as for
    load_config: the base of a script that brings its own model and data."""
    return _validated({}, _changes(settings, overrides), "hpctrain's defaults")


def with_settings(config: Config, settings: dict) -> Config:
    """`config` with `settings` (as for load_config) applied and validated again."""
    return _validated(config.model_dump(mode="json"), _changes(settings), "the configuration")


def _changes(settings: dict | None, overrides: list[str] = ()) -> list[tuple[list[str], Any,
                                                                          str]]:
    """(keys, value, as told) of Python settings, then of key=value overrides."""
    return [*((key.split("."), value, f"{key}={value!r}")
              for key, value in flatten(settings or {}).items()),
            *((*parse_override(text), text) for text in overrides)]


def _validated(tree: dict, changes: list[tuple[list[str], Any, str]], source: str) -> Config:
    """`tree` with the changes (keys, value, as told) applied, as a Config. A file path that
    names user code is read from the current directory; a per-device train.batch_size
    replaces the recipe's global one."""
    for keys, value, text in changes:
        if isinstance(value, str) and (".".join(keys) in CODE_KEYS or
                                       ".".join(keys[:-1]) + ".*" in CODE_KEYS):
            value = user_code.absolute(value, Path.cwd())
        _set_dotted(tree, keys, value, text)
    changed = {".".join(keys) for keys, _, _ in changes}
    if "train.batch_size" in changed and "train.global_batch_size" not in changed:
        tree.get("train", {}).pop("global_batch_size", None)  # the per-device batch asked for
    if changes:
        source += " with overrides " + " ".join(text for _, _, text in changes)
    try:
        return Config.model_validate(tree)
    except ValidationError as err:
        raise _explain(err, source) from None


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested mapping as {'a.b.c': value}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
