"""A Hugging Face Trainer script moved to hpctrain.fit (issue 67): the same model, data,
collator, TrainingArguments and compute_metrics give, against `Trainer.train()` itself, the
same loss at every step, the same learning rate and the same evaluation figures."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hpctrain
from hf_text import text_task
from launching import records
from recipes import FIXTURES

# the sampler's order is the one thing a script does not say the same way in both: in order
COMMON = dict(logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
              train_sampling_strategy="sequential")
ARGUMENTS = {
    # 300 samples in batches of 16: a last batch of 12, kept as the Trainer keeps it
    "linear warmup, weight decay, fused AdamW, evaluation each epoch": dict(
        per_device_train_batch_size=16, num_train_epochs=3, learning_rate=5e-3,
        warmup_steps=3, weight_decay=0.01, eval_strategy="epoch"),
    "cosine warmup ratio, accumulation, clipping, label smoothing, evaluation by steps": dict(
        per_device_train_batch_size=10, gradient_accumulation_steps=2, max_steps=25,
        learning_rate=4e-3, lr_scheduler_type="cosine", warmup_steps=0.2, max_grad_norm=0.5,
        label_smoothing_factor=0.1, optim="adamw_torch", eval_strategy="steps", eval_steps=10,
        per_device_eval_batch_size=7, dataloader_drop_last=True),
}


def accuracy(prediction) -> dict:
    """A compute_metrics as Trainer scripts write it."""
    return {"accuracy": float((prediction.predictions.argmax(-1) ==
                               prediction.label_ids).mean()),
            "rows": len(prediction.label_ids)}


@pytest.fixture(scope="module")
def made():
    model, *data = text_task()
    return model, copy.deepcopy(model.state_dict()), data


@pytest.fixture
def text(made):
    """(model as built, train set, validation set, collator)."""
    model, first, data = made
    model.load_state_dict(first)
    return (model, *data)


@pytest.mark.parametrize("name", ARGUMENTS)
def test_fit_with_the_trainer_s_arguments_trains_as_the_trainer(text, tmp_path, name):
    from transformers import Trainer, TrainingArguments

    model, train, val, collate = text
    first = copy.deepcopy(model.state_dict())
    settings = {**COMMON, **ARGUMENTS[name]}
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path / "hf"), **settings),
                      train_dataset=train, eval_dataset=val, data_collator=collate,
                      compute_metrics=accuracy)
    trainer.train()
    theirs = [entry for entry in trainer.state.log_history if "loss" in entry]
    their_evals = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    model.load_state_dict(first)

    summary = hpctrain.fit(model, args=TrainingArguments(str(tmp_path / "mine"), **settings),
                           train_dataset=train, eval_dataset=val, data_collator=collate,
                           compute_metrics=accuracy, report=False, data={"num_workers": 0})
    mine, my_evals = records(summary["run_dir"], "train"), records(summary["run_dir"], "eval")
    assert [r["step"] for r in mine] == [entry["step"] for entry in theirs]
    assert [r["loss"] for r in mine] == pytest.approx([e["loss"] for e in theirs], rel=1e-6)
    # hpctrain's lr is the rate after the step, the Trainer's the rate the step used
    assert [r["lr"] for r in mine[:-1]] == pytest.approx(
        [e["learning_rate"] for e in theirs[1:]], rel=1e-9, abs=1e-15)
    assert [r["step"] for r in my_evals][:len(their_evals)] == \
        [e["step"] for e in their_evals]
    for r, e in zip(my_evals, their_evals):
        assert r["val_loss"] == pytest.approx(e["eval_loss"], rel=1e-6)
        assert (r["val_accuracy"], r["val_rows"]) == (e["eval_accuracy"], e["eval_rows"])
    if settings.get("num_train_epochs", 0) >= 3:  # long enough to learn (at first: 0.47)
        assert summary["final_val_accuracy"] > 0.9


def test_the_trainer_s_arguments_as_a_recipe_train_alike_from_the_command_line(text, tmp_path):
    """The settings fit translates the arguments into, given to `hpctrain run` beside a
    recipe naming the same model and data: the same loss at every step as the Trainer's."""
    from transformers import Trainer, TrainingArguments

    from hpctrain.hf_trainer import translate

    model, train, val, collate = text
    first = copy.deepcopy(model.state_dict())
    args = TrainingArguments(str(tmp_path / "hf"), **COMMON, **ARGUMENTS[
        "linear warmup, weight decay, fused AdamW, evaluation each epoch"])
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val,
                      data_collator=collate)
    trainer.train()
    model.load_state_dict(first)  # as the recipe's factory builds it again
    fixture = FIXTURES / "hf_recipe.py"
    recipe = tmp_path / "text.yaml"
    recipe.write_text(f"name: text\ntask: classification\n"
                      f"model: {{name: '{fixture}:classifier'}}\n"
                      f"data: {{dataset: '{fixture}:reviews'}}\nreport: false\n")
    settings = {**translate(args, steps_per_epoch=19), "data.num_workers": 0}
    done = subprocess.run([sys.executable, "-m", "hpctrain", "run", str(recipe),
                           *(f"{key}={json.dumps(value)}" for key, value in settings.items())],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = next(Path(args.output_dir).glob("text-*"))
    theirs = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert [r["loss"] for r in records(run, "train")] == pytest.approx(theirs, rel=1e-6)


def test_a_hugging_face_model_trains_through_fit_as_it_is(text, tmp_path, capsys):
    """Without TrainingArguments: its padding collator's BatchEncoding and its own loss, the
    Trainer's defaults said, and the samples each epoch leaves out said."""
    model, train, val, collate = text
    summary = hpctrain.fit(model, train, val, collate_fn=collate, output_dir=str(tmp_path),
                           train={"epochs": 2}, data={"num_workers": 0}, report=False)
    said = capsys.readouterr().out
    assert "fit's defaults for a Hugging Face model (the Trainer's): optim.name=adamw" in said
    assert "each epoch trains on 296 of the 300 samples: the last 4 make no whole step of 8" \
        in said
    assert summary["status"] == "completed" and summary["steps"] == 74
    # DataCollatorWithPadding pads each batch to its longest review (5 to 11 tokens)
    assert 0.05 < summary["padding_fraction"] < 0.5
    trained = records(summary["run_dir"], "train")
    assert all(0 < r["padding_fraction"] < 1 for r in trained)


def test_a_padding_dataloader_without_validation_data_holds_out_a_part_it_batches_too(
        text, tmp_path):
    """Before, the part held out for validation left the DataLoader's collate behind, and
    torch's default collation refused samples of different lengths."""
    from torch.utils.data import DataLoader

    model, train, _, collate = text
    summary = hpctrain.fit(model, DataLoader(train, batch_size=16, collate_fn=collate,
                                             shuffle=True), output_dir=str(tmp_path),
                           train={"epochs": 1}, data={"num_workers": 0}, report=False)
    assert summary["status"] == "completed"
    assert records(summary["run_dir"], "eval")[-1]["val_loss"] > 0  # 30 reviews held out
    assert summary["batch_size_per_device"] == 16  # the loader's, not the Trainer's default 8
