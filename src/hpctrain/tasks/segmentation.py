"""Segmentation of your own tensors: a class for every element of the sample (a pixel of an
image, a step of a signal). The target is an integer mask, (H, W) or (T,) or any shape; the
model gives (B, C, *mask) logits, the class axis second as torch's cross-entropy takes them.
Elements labelled -100 (torch's ignore_index) are left out of the loss and the metrics.
Reported: the share of elements right (pixel accuracy) and the mean over classes of
intersection over union (mIoU; a class that appears in neither the mask nor the prediction of
any evaluated sample is left out of the mean).

torch is imported when the task is built, never when a recipe is read (`spec.py`).
"""

from __future__ import annotations

from hpctrain.tasks import tensors
from hpctrain.tasks.image_classification import ACCURACY_CURVES
from hpctrain.tasks.spec import Curve, Measured, TaskSetup, TaskSpec

IGNORED = -100  # torch.nn.CrossEntropyLoss's ignore_index
CURVES = (Curve("mean IoU", "validation mIoU", "eval", "val_miou"), *ACCURACY_CURVES[:2])


def segmentation(device, num_classes: int, model_name: str, labels_keyword: str | None = None):
    import torch
    import torch.nn.functional as F

    from hpctrain.errors import ConfigError
    from hpctrain.tasks.steps import Batch, Task, logits_of, preferring_model_loss

    def to_device(batch, training: bool) -> Batch:
        inputs, masks = tensors.split(batch)
        masks = torch.as_tensor(masks).to(device, torch.long, non_blocking=True)
        inputs = tensors.with_labels(tensors.moved(inputs, device), masks, labels_keyword)
        return Batch(inputs, masks, masks)

    def checked(outputs, masks):
        logits = logits_of(outputs)
        if logits.dim() != masks.dim() + 1 or logits.shape[2:] != masks.shape[1:] or \
                logits.shape[1] != num_classes:
            raise ConfigError(
                f"model.name {model_name} gives outputs of shape {tuple(logits.shape)} for "
                f"masks of shape {tuple(masks.shape)} (batch first): a segmentation model "
                f"gives (batch, {num_classes} classes, *the mask's shape)")
        return logits

    @preferring_model_loss
    def loss(outputs, batch: Batch):
        """The mean over the elements kept, summed here: torch's own mean over a mask adds
        with atomics on CUDA (nll_loss2d's forward), which `deterministic=true` refuses."""
        each = F.cross_entropy(checked(outputs, batch.targets).float(), batch.targets,
                               ignore_index=IGNORED, reduction="none")
        return each.sum() / (batch.targets != IGNORED).sum().clamp(min=1)

    def counts(classes):
        """Elements per class, by sorting (bincount has no deterministic CUDA kernel, and
        `deterministic=true` refuses it)."""
        edges = torch.searchsorted(classes.sort().values,
                                   torch.arange(num_classes + 1, device=classes.device))
        return edges[1:] - edges[:-1]

    def sums(outputs, batch: Batch, loss, training: bool):
        masks = batch.labels
        predicted = checked(outputs, masks).argmax(dim=1)
        kept = masks != IGNORED
        truth, guess = masks[kept], predicted[kept]
        both = counts(truth[truth == guess])
        either = counts(truth) + counts(guess) - both
        return torch.cat([torch.stack([(truth == guess).sum(), truth.new_tensor(truth.numel()),
                                       truth.new_tensor(masks.shape[0])]),
                          both, either]).double()

    def values(s: dict) -> dict:
        unions = [(s[f"intersection:{c}"], s[f"union:{c}"]) for c in range(num_classes)]
        present = [both / either for both, either in unions if either > 0]
        return {"accuracy": s["correct"] / max(s["elements"], 1),
                "miou": sum(present) / len(present) if present else 0.0}

    names = ("correct", "elements", "samples", *(f"intersection:{c}" for c in range(num_classes)),
             *(f"union:{c}" for c in range(num_classes)))
    return Task(SPEC.name, SPEC.unit, names, None, to_device, loss, sums, values)


def build(setup: TaskSetup):
    return segmentation(setup.device, setup.num_classes, setup.config.model.name,
                        tensors.labels_keyword(setup.model))


def describe(config, num_classes: int | None, vocab_size: int | None) -> str:
    return f"tensors, a class of {num_classes} for every element"


def figures(measured: Measured) -> dict:
    final = measured.final_eval or {}
    return {"images_per_second": None,  # summary.json has the key for every task
            "final_val_miou": final.get("val_miou")}


SPEC = TaskSpec(name="segmentation", data_kind=tensors.KIND, unit="samples",
                objective="best_val_accuracy:max", default_model="", curves=CURVES,
                figures=figures, rate_label="samples", sample_size=None, build=build,
                describe=describe, classes_from_output=True, targets="mask",
                fit_defaults=tensors.FIT_DEFAULTS)
