"""The recipe's training sections: `train`, `optim`, `schedule`, `ema`, `checkpoint`, `fp8`,
`trial`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hpctrain.sections import Auto, Section


class EmaConfig(Section):
    enabled: bool = Field(False, description="keep an exponential moving average of the "
                          "weights, evaluated and saved beside them")
    decay: float = Field(0.999, gt=0, lt=1, description="the average's weight on its past at "
                         "each step")


class OptimConfig(Section):
    name: Literal["sgd", "adamw", "lars", "lamb"] = Field(
        "sgd", description="the optimiser: torch's SGD and AdamW, or LARS and LAMB for large "
        "batches")
    lr: float = Field(0.1, gt=0, description="the peak learning rate (after the warmup, "
                      "before lr_scaling)")
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd and lars: the momentum")
    nesterov: bool = Field(False, description="sgd and lars: Nesterov's momentum")
    betas: tuple[float, float] = Field((0.9, 0.999), description="adamw and lamb: the "
                                       "moments' decay rates")
    eps: float = Field(1e-8, gt=0, description="adamw: the term added to the denominator")
    fused: bool | Auto = Field("auto", description="sgd and adamw in torch's fused kernel "
                               "(on the CPU too: Hugging Face's adamw_torch_fused) or its "
                               "foreach one; auto: fused on a GPU, foreach elsewhere")
    weight_decay: float = Field(5e-5, ge=0, description="the weights' decay (decoupled for "
                                "adamw)")
    no_decay_norm_bias: bool = Field(True, description="no weight decay on biases and "
                                     "normalisation weights (the parameters of one dimension)")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="lr scaled with the global batch over reference_batch_size: "
        "linearly (Goyal et al.) or by its square root")
    reference_batch_size: int = Field(256, ge=1, description="the global batch lr is given "
                                      "for, when lr_scaling scales it")
    grad_clip_norm: float | None = Field(None, gt=0, description="clip the gradients' total "
                                         "norm to this before each step (None: no clipping)")
    pretrained_lr_scale: float = Field(1.0, gt=0, le=1, description="with "
                                       "model.pretrained: the pretrained layers' learning "
                                       "rate as a share of optim.lr (0.1: ten times lower); "
                                       "the replaced head trains at optim.lr")
    ema: EmaConfig = EmaConfig()


class ScheduleConfig(Section):
    name: Literal["cosine", "linear", "step", "onecycle", "constant"] = Field(
        "cosine", description="after the warmup: half a cosine or a straight line down to "
        "min_lr_ratio at the last step, steps at milestones, one cycle, or constant")
    warmup_epochs: float = Field(0.0, ge=0, description="epochs the LR rises linearly to "
                                 "its peak over")
    warmup_steps: int | None = Field(None, ge=0, description="the same in optimiser steps "
                                     "(instead of warmup_epochs)")
    warmup_from_zero: bool = Field(False, description="the warmup's first step at LR 0, the "
                                   "peak one step later, as Hugging Face's schedules (fit "
                                   "with TrainingArguments sets it); false: the first step at "
                                   "peak / warmup steps")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="cosine and linear: the last "
                                "step's LR as a share of the peak")
    milestones: list[float] = Field(default_factory=lambda: [30, 60, 80],
                                    description="epochs at which 'step' multiplies by gamma")
    gamma: float = Field(0.1, gt=0, le=1, description="'step': the factor at each "
                         "milestone")
    pct_start: float = Field(0.25, gt=0, lt=1, description="'onecycle' rising fraction")

    @model_validator(mode="after")
    def _one_warmup(self):
        if self.warmup_steps is not None and self.warmup_epochs:
            raise ValueError(f"give the warmup once: schedule.warmup_steps="
                             f"{self.warmup_steps} or schedule.warmup_epochs="
                             f"{self.warmup_epochs}, not both")
        return self

    def warmup(self, steps_per_epoch: int) -> int:
        """The optimiser steps of the warmup: warmup_steps, else warmup_epochs' steps."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return round(self.warmup_epochs * steps_per_epoch)


class TrainConfig(Section):
    epochs: float = Field(10, gt=0, description="passes over the training set (a fraction "
                          "trains part of one)")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimiser "
                                                          "steps (overrides epochs)")
    batch_size: int = Field(128, ge=1, description="per-device micro-batch")
    global_batch_size: int | None = Field(
        None, ge=1, description="when set, fixes the samples per optimiser step whatever the "
        "number of processes: batch_size becomes global / (processes x grad_accum_steps). "
        "A train.batch_size override replaces a recipe's global_batch_size")
    grad_accum_steps: int = Field(1, ge=1, description="micro-batches whose gradients add "
                                  "up to one optimiser step")
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="classification: the share "
                                   "of each target spread over the other classes")
    log_every: int = Field(20, ge=1, description="optimiser steps between metric read-backs")
    eval_every_epochs: float = Field(1, gt=0, description="epochs between evaluations (and "
                                     "one at the end, always)")
    eval_every_steps: int | None = Field(None, ge=1, description="optimiser steps between "
                                         "evaluations, in place of eval_every_epochs")
    fuse_eval: bool | Auto = Field(
        "auto", description="evaluate with each batch-norm folded into the convolution before "
        "it (train/validation/fused_eval.py); auto: where the model has such pairs, traces "
        "with torch.fx and is whole on each process (not FSDP, tensor or pipeline parallel)")
    nan_patience: int = Field(2, ge=1, description="stop after this many logging intervals "
                                                   "in a row with only non-finite losses")


class CheckpointConfig(Section):
    every_steps: int | None = Field(None, ge=1, description="optimiser steps between "
                                    "checkpoints, in place of every_epochs")
    every_epochs: float | None = Field(1, gt=0, description="epochs between checkpoints "
                                       "(None, with every_steps None: only at the end and at "
                                       "a stop)")
    every: Literal["auto"] | None = Field(
        None, description="auto: the interval that wastes least (Daly's) for the measured "
        "save time and the run's rate of stops without a word (a prior of one a day until "
        "it has its own), in place of every_steps and every_epochs")
    prior_stop_hours: float = Field(
        24.0, gt=0, description="checkpoint.every=auto's prior: one stop without a word per "
        "this many hours, until the run's own stops say otherwise (your cluster's known "
        "failure rate, say)")
    keep_last: int = Field(3, ge=1, description="checkpoints kept, the newest (older ones "
                           "removed once a newer one is whole)")
    async_save: bool = Field(False, description="write in the background while training "
                                                "goes on (the state is copied to host first)")

    def steps_between(self, steps_per_epoch: int) -> int:
        """The optimiser steps between saves: every_steps, else every_epochs' steps (none:
        only at the end and at a stop); checkpoint.every=auto's pacer decides otherwise."""
        return self.every_steps or max(1, round((self.every_epochs or 1e9) * steps_per_epoch))

    @model_validator(mode="after")
    def _one_interval(self):
        if self.every == "auto" and self.every_steps is not None:
            raise ValueError("checkpoint.every=auto chooses the interval: leave "
                             "checkpoint.every_steps out")
        return self


class Fp8Config(Section):
    """precision=fp8 (train/hardware/fp8.py): which Linear layers compute in float8, and how their
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
