"""Multi-label classification of your own tensors: each sample's target is a multi-hot
vector (C,) of 0s and 1s, any number of labels on at once. Binary cross-entropy on the logits;
a label is predicted on where its logit is above 0 (probability 0.5). Reported: F1 over every
(sample, label) decision (micro-averaged, scikit-learn's f1_score(average="micro")), its
precision and recall, and the share of samples whose every label is right.

torch is imported when the task is built, never when a recipe is read (`spec.py`).
"""

from __future__ import annotations

from hpctrain.tasks import tensors
from hpctrain.tasks.regression import aligned
from hpctrain.tasks.spec import Curve, Measured, TaskSetup, TaskSpec

CURVES = (Curve("F1 (micro)", "train F1", "train", "train_f1"),
          Curve("F1 (micro)", "validation F1", "eval", "val_f1"))
SUMS = ("loss_sum", "decisions", "true_positives", "false_positives", "false_negatives",
        "exact", "samples")


def multilabel(device, model_name: str, labels_keyword: str | None = None):
    import torch
    import torch.nn.functional as F

    from hpctrain.tasks.steps import (Batch, Task, logits_of, padding_counted,
                                      preferring_model_loss)

    def to_device(batch, training: bool) -> Batch:
        inputs, targets = tensors.split(batch)
        targets = torch.as_tensor(targets).to(device, torch.get_default_dtype(),
                                              non_blocking=True)
        inputs = tensors.with_labels(tensors.moved(inputs, device), targets, labels_keyword)
        return Batch(inputs, targets, targets)

    @preferring_model_loss
    def loss(outputs, batch: Batch):
        logits = aligned(logits_of(outputs), batch.targets, model_name)
        return F.binary_cross_entropy_with_logits(logits.float(), batch.targets.float())

    def sums(outputs, batch: Batch, loss, training: bool):
        on = aligned(logits_of(outputs), batch.targets, model_name) > 0
        truth = batch.targets > 0.5
        rows, decisions = on.shape[0], on.numel()
        return torch.stack([loss.detach().double() * decisions,
                            *(count.double() for count in (
                                torch.tensor(decisions, device=on.device), (on & truth).sum(),
                                (on & ~truth).sum(), (~on & truth).sum(),
                                (on == truth).reshape(rows, -1).all(dim=1).sum(),
                                torch.tensor(rows, device=on.device)))])

    def values(s: dict) -> dict:
        hits = s["true_positives"]
        said, real = hits + s["false_positives"], hits + s["false_negatives"]
        return {"loss": s["loss_sum"] / max(s["decisions"], 1),  # best_val_loss: the BCE
                "f1": 2 * hits / (said + real) if said + real else 0.0,
                "precision": hits / said if said else 0.0,
                "recall": hits / real if real else 0.0,
                "exact_match": s["exact"] / max(s["samples"], 1)}

    return padding_counted(Task(SPEC.name, SPEC.unit, SUMS, None, to_device, loss, sums,
                                values))


def build(setup: TaskSetup):
    return multilabel(setup.device, setup.config.model.name,
                      tensors.labels_keyword(setup.model))


def describe(config, num_classes: int | None, vocab_size: int | None) -> str:
    return f"tensors, {num_classes} labels each on or off"


def figures(measured: Measured) -> dict:
    final = measured.final_eval or {}
    return {"images_per_second": None,  # summary.json has the key for every task
            "padding_fraction": measured.padding_fraction,
            "best_val_loss": measured.best_val_loss, "final_val_f1": final.get("val_f1"),
            "final_val_precision": final.get("val_precision"),
            "final_val_recall": final.get("val_recall"),
            "final_val_exact_match": final.get("val_exact_match")}


SPEC = TaskSpec(name="multilabel_classification", data_kind=tensors.KIND, unit="samples",
                objective="best_val_loss:min", default_model="", curves=CURVES,
                figures=figures, rate_label="samples", sample_size=None, build=build,
                describe=describe, targets="labels",
                fit_defaults=tensors.FIT_DEFAULTS)
