"""Image classification: top-1 accuracy over classes, images normalised and laid out on the
device, mixup/CutMix (soft targets) in training when the recipe asks.

torch is imported when the task is built, never when a recipe is read (`spec.py`).
"""

from __future__ import annotations

from hpctrain.tasks.spec import Curve, Measured, TaskSetup, TaskSpec

ACCURACY_CURVES = (Curve("accuracy", "train accuracy", "train", "train_accuracy"),
                   Curve("accuracy", "validation accuracy", "eval", "val_accuracy"),
                   Curve("accuracy", "validation accuracy (EMA)", "eval", "val_accuracy_ema"))


def image_classification(batcher, augment, num_classes: int, label_smoothing: float,
                         batch_size: int, model_name: str):
    """The task on images that `batcher` moves to the device and normalises; `augment` is
    the recipe's data.augment (its mixup and CutMix settings)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from hpctrain.tasks.mixing import build_mixing
    from hpctrain.tasks.steps import TOP1_SUMS, Batch, Task, top1_accuracy, top1_sums

    mixing = build_mixing(augment, num_classes, label_smoothing, batch_size)
    hard = nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def soft(logits, targets):  # timm's SoftTargetCrossEntropy, written out: importing timm
        # costs every run a second and a half
        return torch.sum(-targets * F.log_softmax(logits, dim=-1), dim=-1).mean()

    def loss(logits, batch: Batch):  # soft targets come from mixing
        return (soft if batch.targets.dim() == 2 else hard)(logits, batch.targets)

    def to_device(batch, training: bool) -> Batch:
        images, labels = batcher(*batch)
        if training and mixing is not None:
            mixed, targets = mixing(images, labels)
            return Batch(mixed, targets, labels)
        return Batch(images, labels, labels)

    return Task(SPEC.name, SPEC.unit, TOP1_SUMS, None, to_device, loss,
                top1_sums(num_classes, model_name), top1_accuracy)


def build(setup: TaskSetup):
    config = setup.config
    return image_classification(setup.batcher(), config.data.augment, setup.num_classes,
                                config.train.label_smoothing, setup.batch_size,
                                config.model.name)


def describe(config, num_classes: int | None, vocab_size: int | None) -> str:
    return f"images, {num_classes} classes"


def figures(measured: Measured) -> dict:
    return {"images_per_second": measured.samples_per_second}


SPEC = TaskSpec(name="image_classification", data_kind="images", unit="images",
                objective="best_val_accuracy:max", default_model="hpctrain:resnet_small",
                curves=ACCURACY_CURVES, figures=figures, rate_label="img",
                sample_size="data.images.image_size", build=build, describe=describe,
                classes_from_output=True)
