"""Your compute_metrics on the whole validation set, as Hugging Face's Trainer calls it:
`fn(EvalPrediction(predictions=logits, label_ids=labels)) -> {name: number}`, reported as
val_NAME beside the task's own figures (yours win a name you both give).

The logits and labels of the rows kept (not the sampler's padding repeats) are copied to the
host batch by batch (one wait on the device per evaluation batch, as the Trainer has),
gathered from every rank in rank order and measured on rank 0, which tells every rank the
figures. Logits whose trailing shape differs from batch to batch (token classification's
padded lengths) are padded with -100, as the Trainer pads them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hpctrain import user_code
from hpctrain.errors import ConfigError
from hpctrain.tasks.steps import Batch, logits_of

PAD = -100  # what the Trainer pads predictions and labels of different lengths with


class Predictions:
    """The validation set's logits and labels for the recipe's task.compute_metrics."""

    def __init__(self, reference: str):
        self.reference = reference
        self.function: Callable = user_code.load(reference, "task.compute_metrics")
        self.logits: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []

    def add(self, outputs, batch: Batch) -> None:
        self.logits.append(logits_of(outputs).detach().float().cpu())
        self.labels.append(batch.labels.detach().cpu())

    def figures(self, distributed) -> dict:
        """The function's figures, named val_NAME, on every rank."""
        parts = distributed.gather_objects((_joined(self.logits), _joined(self.labels)))
        figures = None
        if distributed.is_main:
            predictions = _joined([p for p, _ in parts if p is not None])
            labels = _joined([label for _, label in parts if label is not None])
            figures = self._measured(predictions, labels)
        return distributed.broadcast(figures)

    def _measured(self, predictions, labels) -> dict:
        returned = self.function(_evaluation(predictions, labels))
        where = f"task.compute_metrics {self.reference}"
        if not isinstance(returned, dict):
            raise ConfigError(f"{where} returned a {type(returned).__name__}: return a dict of "
                              "metric names and numbers")
        figures = {}
        for name, value in returned.items():
            try:  # a number, or a NumPy or torch scalar
                figures[f"val_{str(name).removeprefix('eval_')}"] = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{where} returned {name}={value!r}: each figure is one "
                                  "number") from None
        return figures


def _joined(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The batches' tensors one after another, trailing axes padded with PAD to the
    longest."""
    if not tensors:
        return None
    widest = [max(sizes) for sizes in zip(*(t.shape[1:] for t in tensors))]
    padded = []
    for tensor in tensors:
        grow = [n for have, want in zip(reversed(tensor.shape[1:]), reversed(widest))
                for n in (0, want - have)]
        padded.append(torch.nn.functional.pad(tensor, grow, value=PAD) if any(grow) else tensor)
    return torch.cat(padded)


def _evaluation(predictions: torch.Tensor, labels: torch.Tensor):
    """transformers' EvalPrediction of NumPy arrays where transformers is installed (what a
    compute_metrics written for the Trainer reads), else a pair of them."""
    arrays = predictions.numpy(), labels.numpy()
    try:
        from transformers import EvalPrediction
    except ImportError:
        return arrays
    return EvalPrediction(predictions=arrays[0], label_ids=arrays[1])
