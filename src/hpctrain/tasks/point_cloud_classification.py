"""Point-cloud classification: top-1 accuracy over clouds (batch, points, 3), each cloud
perturbed on the device in training (data.points: dropout, scale, turn about the up axis,
jitter). A model that returns (logits, regulariser) while training, as PointNet does with
its feature transform's, has the regulariser added to the loss.

torch is imported when the task is built, never when a recipe is read (`spec.py`).
"""

from __future__ import annotations

import math

from hpctrain.tasks.image_classification import ACCURACY_CURVES
from hpctrain.tasks.spec import Measured, TaskSetup, TaskSpec


def point_cloud_classification(device, augment, up_axis: int, label_smoothing: float,
                               num_classes: int, model_name: str):
    from torch import nn

    from hpctrain.tasks.steps import (TOP1_SUMS, Batch, Task, logits_of, top1_accuracy,
                                      top1_sums, with_regulariser)

    criterion = with_regulariser(nn.CrossEntropyLoss(label_smoothing=label_smoothing))
    top1 = top1_sums(num_classes, model_name)

    def to_device(batch, training: bool) -> Batch:
        points, labels = (t.to(device, non_blocking=True) for t in batch)
        if training:
            points = perturb(points, augment, up_axis)
        return Batch(points, labels, labels)

    def loss(outputs, batch: Batch):
        return criterion(outputs, batch.targets)

    def sums(outputs, batch: Batch, loss, training: bool):
        return top1(logits_of(outputs), batch, loss, training)

    return Task(SPEC.name, SPEC.unit, TOP1_SUMS, None, to_device, loss, sums,
                top1_accuracy)


def perturb(points, augment, up_axis: int):
    """A training batch (clouds, points, 3) perturbed on its device, each cloud drawn anew:
    points dropped (PointNet++'s random dropout: a share up to `dropout_max` replaced by the
    cloud's first point, so the shape stays), scaled, turned about the up axis, jittered.
    Draws come from torch's generator of that device, which checkpoints save: a resumed run
    perturbs as the uninterrupted one would."""
    import torch

    clouds, count, _ = points.shape
    device, dtype = points.device, points.dtype
    if augment.dropout_max > 0:
        share = torch.rand(clouds, 1, device=device) * augment.dropout_max
        dropped = torch.rand(clouds, count, device=device) < share
        points = torch.where(dropped[..., None], points[:, :1], points)
    low, high = augment.scale
    points = points * (low + (high - low) * torch.rand(clouds, 1, 1, device=device, dtype=dtype))
    if augment.rotate:
        angle = torch.rand(clouds, device=device) * (2 * math.pi)
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
        a, b = [axis for axis in range(3) if axis != up_axis]  # the plane turned in
        rotation = torch.zeros(clouds, 3, 3, device=device, dtype=dtype)
        rotation[:, up_axis, up_axis] = 1
        rotation[:, a, a], rotation[:, a, b] = cos, -sin
        rotation[:, b, a], rotation[:, b, b] = sin, cos
        points = torch.bmm(points, rotation.transpose(1, 2))
    if augment.jitter_sigma > 0:
        noise = torch.randn_like(points) * augment.jitter_sigma
        points = points + noise.clamp(-augment.jitter_clip, augment.jitter_clip)
    return points


def build(setup: TaskSetup):
    config = setup.config
    return point_cloud_classification(setup.device, config.data.points, setup.fact("up_axis"),
                                      config.train.label_smoothing, setup.num_classes,
                                      config.model.name)


def describe(config, num_classes: int | None, vocab_size: int | None) -> str:
    return f"clouds of {config.data.points.num_points} points, {num_classes} classes"


def figures(measured: Measured) -> dict:
    return {"images_per_second": None}  # summary.json has the key for every task


SPEC = TaskSpec(name="point_cloud_classification", data_kind="points", unit="clouds",
                objective="best_val_accuracy:max", default_model="hpctrain:pointnet_small",
                curves=ACCURACY_CURVES, figures=figures, rate_label="clouds",
                sample_size="data.points.num_points", build=build, describe=describe,
                fit_defaults={"optim.name": "adamw", "optim.lr": 2e-3,
                              "optim.weight_decay": 1e-4, "train.batch_size": 32})
