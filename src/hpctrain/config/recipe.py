"""A whole recipe, `Config`: every section, the top-level settings, and the checks that span
sections. One resolved `Config` is the single source of truth for a run: every feature is a
field, consumed in exactly one place.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from hpctrain.config.base import plain_name
from hpctrain.sections import Auto, Section
from hpctrain.config.operation_settings import MonitorConfig, PreemptionConfig, TrackingConfig
from hpctrain.config.parallel_settings import ParallelConfig
from hpctrain.config.task_settings import LightningConfig, ModelConfig, TaskConfig
from hpctrain.config.training_settings import (CheckpointConfig, Fp8Config, OptimConfig,
                                               ScheduleConfig, TrainConfig, TrialConfig)
from hpctrain.data import kinds
from hpctrain.data.settings import DataConfig
from hpctrain.tasks import registry as tasks


# torch.compile's modes that capture CUDA graphs (max-autotune-no-cudagraphs does not)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class Config(Section):
    name: str = Field("default", description="the recipe's name: its runs are named NAME-"
                      "TIME")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="the run's seed (data order, "
                      "initial weights, augmentation); numpy takes seeds below 2**32")
    output_dir: str = Field("runs", min_length=1, description="the folder run directories "
                            "are made in")
    run_name: str | None = Field(None, description="the run directory's name in output_dir "
                                 "(None: NAME-TIME, a new one each run)")
    resume: str | None = Field(None, description="'auto', a run directory or a checkpoint")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="where to "
                        "train: auto (a GPU where one is visible, each process its own under a "
                        "launcher; else the CPU), cpu, cuda or cuda:N")
    precision: Literal["auto", "fp32", "tf32", "fp16", "bf16", "fp8"] = Field(
        "auto", description="the arithmetic of the forward and backward passes; auto: bf16 "
        "on a GPU that has it, else fp16 with loss scaling, fp32 on the CPU")
    channels_last: bool | Auto = Field("auto", description="images laid out NHWC in memory, "
                                       "as GPU convolutions prefer; auto: on a GPU, for "
                                       "image data")
    compile: bool | Auto = Field("auto", description="torch.compile the model; auto: on a "
                                 "GPU with Triton (on the CPU its compile time dominates a "
                                 "short run)")
    compile_mode: Literal["auto", "default", "reduce-overhead", "max-autotune",
                          "max-autotune-no-cudagraphs"] = Field(
        "auto", description="torch.compile's mode; auto: reduce-overhead (CUDA graphs: the "
        "step replayed with one launch) for a small model on one GPU whose batches come in "
        "a few shapes, else default")
    compile_cache: str = Field(
        "shared", min_length=1, description="where torch keeps what compile made, so that a "
        "requeued or resumed job, and a later run of the same model, load it instead of "
        "compiling again: 'shared' (OUTPUT_DIR/.compile-cache, every run of the output "
        "folder), 'run' (in the run directory), a folder of your choosing (each a subfolder "
        "per torch, Triton, Python and device), or 'none' (torch's own, the node's "
        "temporary folder)")
    cudnn_benchmark: bool | Auto = Field("auto", description="cuDNN measures its "
                                         "convolution algorithms for each shape and keeps the "
                                         "fastest; auto: on a GPU, unless deterministic")
    cudnn_attention: bool | Auto = Field(
        "auto", description="cuDNN's attention kernels for scaled_dot_product_attention; "
        "auto: on a GPU where the batches come in a few shapes (cuDNN builds a plan for each "
        "sequence length, tens of milliseconds each), off where their widths vary or are your "
        "collate's")
    deterministic: bool = Field(False, description="torch's deterministic algorithms "
                                "only: the same run, the same numbers, at some speed")
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
    lightning: LightningConfig = LightningConfig()

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
        if self.task.name == "auto":
            self.task.name = tasks.for_model(self.model.name) or self.task.name
        if self.task_spec.steps_model:
            self._model_brings_its_steps()
        elif self.lightning.callbacks:
            raise ValueError(f"lightning.callbacks: callbacks are a LightningModule's (task "
                             f"lightning); task {self.task_spec.name} trains a plain "
                             "torch.nn.Module")
        task = self.task.name
        if self.data.from_user_code:
            kind = tasks.KIND_OF_TASK.get(task, kinds.OWN_DATA)
            problem = kinds.spec(kind).own_data_problem(self.data)
            if problem:
                raise ValueError(problem)
            self.data._kind_of_user_data = kind
            self.data._targets_of_user_data = tasks.TARGETS_OF_TASK.get(task, "classes")
        elif task != "auto" and tasks.KIND_OF_TASK[task] != self.data.kind:
            raise ValueError(f"task {task} cannot learn from data.dataset={self.data.dataset} "
                             f"({self.data.kind}); use task=auto, or data that fits the task")
        self._graphs_fit_the_shapes()
        if self.model.name == "auto":
            if not self.task_spec.default_model:
                raise ValueError(f"task {self.task_spec.name} learns from your own tensors "
                                 "and has no default model: set model.name to yours "
                                 "(package.module:build or path/to/file.py:build)")
            self.model.name = self.task_spec.default_model
        return self

    def _graphs_fit_the_shapes(self) -> None:
        """CUDA graphs record one graph (and its memory) per shape: refused on batches whose
        shapes vary without bound."""
        if self.compile_mode in CUDA_GRAPH_MODES and \
                self.data.kind_spec.shapes(self.data) == "varied":
            fix = self.data.kind_spec.fewer_shapes
            raise ValueError(f"compile_mode={self.compile_mode} captures CUDA graphs, one per "
                             "batch shape, and this data's batches each have a width of their "
                             f"own (data.dataset={self.data.dataset}): use {fix}, or "
                             "compile_mode=default")

    def _model_brings_its_steps(self) -> None:
        """A model with its own steps (a LightningModule) takes your own data, gives its own
        loss and figures, and is trained whole on each process (DDP or FSDP)."""
        what = f"task {self.task_spec.name} (a LightningModule)"
        if not self.data.from_user_code:
            raise ValueError(f"{what} takes the batches your own dataset makes: name its "
                             "factory in data.dataset, or give the datasets to hpctrain.fit, "
                             f"not data.dataset={self.data.dataset}")
        if self.task.loss or self.task.metrics:
            raise ValueError(f"{what}: its training_step gives the loss and self.log its "
                             "figures; task.loss and task.metrics are for a plain nn.Module")
        if self.parallel.tensor > 1 or self.parallel.pipeline > 1:
            raise ValueError(f"{what} trains with data parallelism (DDP or FSDP): "
                             "parallel.tensor and parallel.pipeline stay 1")
        if self.optim.ema.enabled:
            raise ValueError(f"{what}: optim.ema would evaluate a copy beside the module "
                             "whose hooks run; keep an EMA in the module (Lightning's "
                             "WeightAveraging callback's work) or train without it")

    _told: frozenset[str] = PrivateAttr(frozenset())  # set by config/loading.py

    @property
    def told_keys(self) -> frozenset[str]:
        """The dotted keys the recipe, the settings and the overrides set."""
        return self._told

    def told(self, key: str) -> bool:
        """Whether the recipe, the settings or the overrides set `key` ("train.batch_size"),
        rather than hpctrain's default: where your DataLoader sets the same, the one you
        told hpctrain wins."""
        return key in self.told_keys

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
