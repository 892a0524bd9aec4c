"""The recipe's `task` and `model` sections: what is learned (tasks/registry.py names the
tasks) and by which network.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from hpctrain import user_code
from hpctrain.sections import Section
from hpctrain.tasks import registry as tasks


class TaskConfig(Section):
    """What is learned from the data; `task: NAME` in a recipe is short for `task.name`."""

    name: Literal[("auto", *tasks.NAMES)] = Field(
        "auto", description="auto: from data.dataset (token data: language_modeling, point "
        "clouds: point_cloud_classification, images: image_classification); on your own "
        "tensors of any shape: classification (integer labels), multilabel_classification "
        "(multi-hot vectors), segmentation (integer masks) or regression (float targets), "
        "which hpctrain.fit picks from the first sample; lightning where model.name is a "
        "LightningModule (its own steps, logs and optimiser: docs/lightning.md)")
    loss: str | None = Field(None, description="your own loss instead of the task's: "
                             "module:fn or path/to/file.py:fn, fn(outputs, targets) -> a 0-d "
                             "tensor")
    metrics: dict[str, str] = Field(default_factory=dict, description="your own metrics: "
                                    "name -> module:fn, fn(outputs, labels) -> the batch's "
                                    "sum; reported per sample as name and val_name")

    compute_metrics: str | None = Field(
        None, description="your function of the whole validation set, as Hugging Face's "
        "Trainer calls it: fn(EvalPrediction(predictions, label_ids)) -> {name: number}, "
        "reported as val_NAME (module:fn or path/to/file.py:fn; fit(compute_metrics=fn))")

    @field_validator("loss", "compute_metrics")
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
                    "mse", "mae", "r2", "f1", "precision", "recall", "exact_match", "miou", "lr",
                    "epoch", "step")


class ModelConfig(Section):
    name: str = Field("auto",
                      description="auto: the task's default model (images: "
                      "hpctrain:resnet_small, tokens: hpctrain:gpt_mini, point clouds: "
                      "hpctrain:pointnet_small); torchvision:NAME, timm:NAME, hpctrain:NAME, "
                      "hf:PATH, or "
                      "your own factory: package.module:build or path/to/file.py:build (a "
                      "relative path is read from the recipe's folder)")
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="extra keyword arguments for the constructor")
    pretrained: bool = Field(False, description="torchvision:NAME and timm:NAME: start from "
                             "the library's default pretrained weights, read from its cache "
                             "(TORCH_HOME, HF_HOME; nothing is downloaded: fill the cache "
                             "with hpctrain prefetch RECIPE where there is internet), the "
                             "head replaced for the data's classes; hf:NAME: the weights "
                             "beside its config (a folder, or the hub's cache)")
    freeze: list[str] = Field(default_factory=list, description="parameters left as they "
                              "are (not trained), by name pattern: ['conv1.*', 'layer1.*'] "
                              "(fnmatch; each must match a parameter)")
    activation_checkpointing: bool = Field(False, description="recompute each block's "
                                           "activations in the backward pass instead of "
                                           "keeping them: less memory, about a third more "
                                           "compute (timm's own, else torch's on known block "
                                           "types)")

    @field_validator("pretrained")
    @classmethod
    def _pretrained_from_a_library(cls, value, info):
        name = info.data.get("name", "")
        if value and not name.startswith(("torchvision:", "timm:", "hf:")):
            raise ValueError(f"model.name {name} has no pretrained weights hpctrain can load: "
                             "use torchvision:NAME, timm:NAME or hf:NAME (your own factory "
                             "loads its own)")
        return value


class CallbackConfig(Section):
    """One Lightning callback: its class (or a factory) and its arguments."""

    name: str = Field(description="lightning.pytorch.callbacks:EarlyStopping, your own "
                      "package.module:Class or path/to/file.py:Class (a relative path is "
                      "read from the recipe's folder)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="its arguments: "
                                   "{monitor: val_loss, patience: 3}")

    @field_validator("name")
    @classmethod
    def _is_code(cls, value):
        if not user_code.is_code_reference(value):
            raise ValueError(f"{value!r} is not package.module:Class or path/to/file.py:Class")
        return value


class LightningConfig(Section):
    """What a LightningModule's run (task lightning) takes besides the module, as Lightning's
    Trainer takes it (docs/lightning.md)."""

    callbacks: list[CallbackConfig] = Field(
        default_factory=list, description="Lightning callbacks, as the Trainer's callbacks= "
        "list: EarlyStopping, ModelCheckpoint (hpctrain keeps its best checkpoints), "
        "LearningRateMonitor, your own Callback")
