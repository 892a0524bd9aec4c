"""Regression on your own tensors: mean squared error, reported as MSE, MAE and R².

The target of a sample is a number or a float tensor; the model's output must have the
target's shape, or that shape and a last axis of one ((B, 1) for targets (B,)): anything
else is refused at the first batch, naming both shapes, since broadcasting (B, 1) against
(B,) would silently compare every output with every target. R² is over all target values
together (for one output per sample, scikit-learn's r2_score), from sums that add up over
micro-steps and ranks.

torch is imported when the task is built, never when a recipe is read (`spec.py`).
"""

from __future__ import annotations

from hpctrain.tasks import tensors
from hpctrain.tasks.spec import Curve, Measured, TaskSetup, TaskSpec

CURVES = (Curve("R²", "validation R²", "eval", "val_r2"),
          Curve("mean absolute error", "train MAE", "train", "train_mae"),
          Curve("mean absolute error", "validation MAE", "eval", "val_mae"))
SUMS = ("squared_error", "absolute_error", "values", "target_sum", "target_squares", "samples")


def aligned(outputs, targets, model_name: str):
    """The outputs in the targets' shape, or a ConfigError naming both."""
    from hpctrain.errors import ConfigError

    if outputs.shape == targets.shape:
        return outputs
    if outputs.shape[:-1] == targets.shape and outputs.shape[-1] == 1:
        return outputs.squeeze(-1)
    raise ConfigError(f"model.name {model_name} gives outputs of shape {tuple(outputs.shape)} "
                      f"for targets of shape {tuple(targets.shape)} (batch first): build it "
                      "to give one output per target value")


def regression(device, model_name: str, labels_keyword: str | None = None):
    import torch
    import torch.nn.functional as F

    from hpctrain.tasks.steps import (Batch, Task, logits_of, padding_counted,
                                      preferring_model_loss)

    def to_device(batch, training: bool) -> Batch:
        inputs, targets = tensors.split(batch)
        targets = tensors.moved(torch.as_tensor(targets).to(torch.get_default_dtype()), device)
        inputs = tensors.with_labels(tensors.moved(inputs, device), targets, labels_keyword)
        return Batch(inputs, targets, targets)

    @preferring_model_loss
    def loss(outputs, batch: Batch):
        predicted = aligned(logits_of(outputs), batch.targets, model_name)
        return F.mse_loss(predicted.float(), batch.targets.float())

    def sums(outputs, batch: Batch, loss, training: bool):
        predicted = aligned(logits_of(outputs), batch.targets, model_name).double()
        targets = batch.targets.double()
        error = predicted - targets
        return torch.stack([error.square().sum(), error.abs().sum(),
                            targets.new_tensor(targets.numel()), targets.sum(),
                            targets.square().sum(), targets.new_tensor(targets.shape[0])])

    def values(s: dict) -> dict:
        count = max(s["values"], 1)
        spread = s["target_squares"] - s["target_sum"] ** 2 / count  # the total sum of squares
        return {"loss": s["squared_error"] / count,  # the objective: best_val_loss
                "mse": s["squared_error"] / count, "mae": s["absolute_error"] / count,
                "r2": 1 - s["squared_error"] / spread if spread > 0 else None}  # one value

    return padding_counted(Task(SPEC.name, SPEC.unit, SUMS, None, to_device, loss, sums,
                                values))


def build(setup: TaskSetup):
    return regression(setup.device, setup.config.model.name,
                      tensors.labels_keyword(setup.model))


def describe(config, num_classes: int | None, vocab_size: int | None) -> str:
    return "tensors, regression targets"


def figures(measured: Measured) -> dict:
    final = measured.final_eval or {}
    return {"images_per_second": None,  # summary.json has the key for every task
            "padding_fraction": measured.padding_fraction,
            "best_val_loss": measured.best_val_loss, "final_val_mse": final.get("val_mse"),
            "final_val_mae": final.get("val_mae"), "final_val_r2": final.get("val_r2")}


SPEC = TaskSpec(name="regression", data_kind=tensors.KIND, unit="samples",
                objective="best_val_loss:min", default_model="", curves=CURVES,
                figures=figures, rate_label="samples", sample_size=None, build=build,
                describe=describe, targets="values",
                fit_defaults=tensors.FIT_DEFAULTS)
