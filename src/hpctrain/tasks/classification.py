"""Classification of your own tensors (a 1-D signal, a sequence, features): cross-entropy
and top-1 accuracy, the inputs reaching the model as the dataset made them.

The number of classes is data.num_classes, else the training dataset's `classes` or
`num_classes`, else the width of the model's output on one validation sample (the engine
asks it before training and the run's banner says which it used).

torch is imported when the task is built, never when a recipe is read (`spec.py`).
"""

from __future__ import annotations

from hpctrain.tasks import tensors
from hpctrain.tasks.image_classification import ACCURACY_CURVES
from hpctrain.tasks.spec import Measured, TaskSetup, TaskSpec


def classification(device, num_classes: int, label_smoothing: float, model_name: str,
                   labels_keyword: str | None = None):
    """`labels_keyword`: the keyword the model takes the labels under to compute its own loss
    (tensors.labels_keyword), or None."""
    import torch
    from torch import nn

    from hpctrain.tasks.steps import (TOP1_SUMS, Batch, Task, logits_of,
                                      padding_counted, preferring_model_loss, top1_accuracy,
                                      top1_sums)

    criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    top1 = top1_sums(num_classes, model_name)

    def to_device(batch, training: bool) -> Batch:
        inputs, labels = tensors.split(batch)
        labels = torch.as_tensor(labels).to(device, torch.long, non_blocking=True)
        inputs = tensors.with_labels(tensors.moved(inputs, device), labels, labels_keyword)
        return Batch(inputs, labels, labels)

    @preferring_model_loss
    def loss(outputs, batch: Batch):
        return criterion(logits_of(outputs), batch.targets)

    def sums(outputs, batch: Batch, loss, training: bool):
        return top1(logits_of(outputs), batch, loss, training)

    return padding_counted(Task(SPEC.name, SPEC.unit, TOP1_SUMS, None, to_device, loss, sums,
                                top1_accuracy))


def build(setup: TaskSetup):
    """A model that computes its own loss is not given the labels under label smoothing (its
    loss would not smooth them), as Hugging Face's Trainer."""
    config = setup.config
    smoothing = config.train.label_smoothing
    return classification(setup.device, setup.num_classes, smoothing, config.model.name,
                          None if smoothing else tensors.labels_keyword(setup.model))


def describe(config, num_classes: int | None, vocab_size: int | None) -> str:
    return f"tensors, {num_classes} classes"


def figures(measured: Measured) -> dict:
    return {"images_per_second": None,  # summary.json has the key for every task
            "padding_fraction": measured.padding_fraction}


SPEC = TaskSpec(name="classification", data_kind=tensors.KIND, unit="samples",
                objective="best_val_accuracy:max", default_model="", curves=ACCURACY_CURVES,
                figures=figures, rate_label="samples", sample_size=None, build=build,
                describe=describe, classes_from_output=True,
                fit_defaults=tensors.FIT_DEFAULTS)
