"""A Hugging Face model and its batches as they are (tasks/tensors.py, tasks/steps.py): a
BatchEncoding batch, a ModelOutput, the model's own loss where it computes one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.tasks import registry, tensors
from hpctrain.tasks.spec import TaskSetup
from hpctrain.tasks.steps import first_outputs, logits_of, model_loss
from hf_text import text_task


@pytest.fixture(scope="module")
def text():
    return text_task(train=8, val=4)


def _task(name: str, model, *overrides):
    config = load_config("default", [f"task={name}", "model.name=given:Net",
                                     "data.dataset=given:Data", "train.label_smoothing=0",
                                     *overrides])
    return registry.spec(name).build(TaskSetup(config, torch.device("cpu"), 2, None, 4,
                                               model=model))


def test_a_padding_collator_s_batch_encoding_trains_with_the_model_s_own_loss(text):
    """Before, DataCollatorWithPadding's BatchEncoding (a UserDict, not a dict) was refused,
    and the SequenceClassifierOutput failed on `.shape`."""
    model, train, _, collate = text
    batch = collate([train[i] for i in range(4)])
    assert type(batch).__name__ == "BatchEncoding"
    task = _task("classification", model)
    moved = task.to_device(batch, training=True)
    assert set(moved.inputs) == {"input_ids", "attention_mask", "labels"}
    outputs = tensors.call(model, moved.inputs)
    assert type(outputs).__name__ == "SequenceClassifierOutput"
    assert task.loss(outputs, moved) is outputs.loss  # the model's own, not recomputed
    expected = nn.functional.cross_entropy(outputs.logits, moved.labels)
    torch.testing.assert_close(outputs.loss, expected)
    sums = dict(zip(task.sum_names, task.sums(outputs, moved, outputs.loss, True).tolist()))
    assert sums["samples"] == 4
    assert sums["correct"] == (outputs.logits.argmax(1) == moved.labels).sum()
    mask = batch["attention_mask"]  # padded to the longest: the share of zeros is padding
    assert (sums["real_positions"], sums["positions"]) == (mask.sum(), mask.numel())
    assert task.values(sums)["padding_fraction"] == pytest.approx(1 - mask.float().mean())


def test_label_smoothing_keeps_the_labels_from_the_model_and_smooths_them(text):
    """As Hugging Face's Trainer: its model's loss would not smooth the labels."""
    model, train, _, collate = text
    task = _task("classification", model, "train.label_smoothing=0.1")
    moved = task.to_device(collate([train[i] for i in range(4)]), training=True)
    assert "labels" not in moved.inputs
    outputs = tensors.call(model, moved.inputs)
    assert outputs.loss is None
    torch.testing.assert_close(task.loss(outputs, moved), nn.functional.cross_entropy(
        outputs.logits, moved.labels, label_smoothing=0.1))


class _Regressor(nn.Module):
    """Returns named outputs, and a loss of its own (not the task's MSE) given labels."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x, labels=None):
        logits = self.linear(x)
        return {"logits": logits, "loss": None if labels is None else
                (logits.squeeze(-1) - labels).abs().mean()}


def test_a_regression_model_s_own_loss_is_used_and_its_logits_measured():
    model = _Regressor()
    task = _task("regression", model)
    batch = task.to_device({"x": torch.randn(5, 3), "labels": torch.randn(5)}, training=True)
    outputs = tensors.call(model, batch.inputs)
    assert task.loss(outputs, batch) is outputs["loss"]
    sums = dict(zip(task.sum_names, task.sums(outputs, batch, outputs["loss"], True).tolist()))
    error = outputs["logits"].squeeze(-1) - batch.targets
    assert sums["absolute_error"] == pytest.approx(error.abs().sum().item())


def test_a_model_that_takes_no_labels_is_not_given_them():
    class Plain(nn.Module):
        def forward(self, x):
            return x
    assert tensors.labels_keyword(Plain()) is None
    assert tensors.labels_keyword(_Regressor()) == "labels"
    task = _task("classification", Plain())
    batch = task.to_device({"x": torch.randn(2, 2), "labels": torch.tensor([0, 1])}, True)
    assert set(batch.inputs) == {"x"}


def test_named_outputs_without_logits_are_refused_naming_what_they_hold():
    with pytest.raises(ConfigError, match=r"a dict holding scores, loss: hpctrain reads its "
                                          r"`logits`"):
        logits_of({"scores": torch.zeros(2), "loss": torch.zeros(())})
    assert model_loss(torch.zeros(2)) is None and model_loss((torch.zeros(2),)) is None


def test_evaluation_s_padding_repeats_leave_the_model_s_own_loss_out(text):
    """The sampler's repeats fill the last evaluation batch: the model's loss counted them,
    so the rows kept are measured by the task's loss instead."""
    model, train, _, collate = text
    outputs = model(**collate([train[i] for i in range(4)]))
    kept = first_outputs(outputs, 3, 4)
    assert set(kept) == {"logits"} and kept["logits"].shape == (3, 2)
    assert first_outputs(outputs, 4, 4) is outputs
    assert model_loss(kept) is None
