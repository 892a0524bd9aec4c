"""Your batches as you make them (issue 53): a variable-length text classifier with its own
pad collate trains through hpctrain.fit and through a recipe, on one process and two, and
`memory` and `profile` take it; samples of different shapes without a collate are one line
(exit 2), before training or from a loader worker; bucketing by length on a classification
task says the padding it saves; the evaluation batch is data.val_batch_size.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/cluster/test_batching.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import hpctrain
from hpctrain.errors import ConfigError, DataError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "text_data.py"
sys.path.insert(0, str(FIXTURE.parent))
from text_data import (Sentences, TextClassifier, Uneven, hf_collate,  # noqa: E402
                       pad_collate)
from recipes import text_recipe
from conftest import loader_workers, running
from launching import records

QUICK = dict(train={"epochs": 2, "batch_size": 32}, optim={"name": "adamw", "lr": 0.003},
             data={"num_workers": 0}, tensorboard=False, report=False)


@pytest.mark.parametrize("collate", [pad_collate, hf_collate])
def test_your_collate_batches_variable_lengths_through_fit(tmp_path, capsys, collate):
    """(inputs dict, labels) and Hugging Face's one dict with "labels": the model is called
    with the padded ids and their attention mask, as the collate made them. A classifier's
    evaluations record its validation loss; a text task's summary prints no image rows."""
    torch.manual_seed(0)
    summary = hpctrain.fit(TextClassifier(), Sentences(1024, 0), Sentences(256, 1),
                           collate_fn=collate, output_dir=str(tmp_path), **QUICK)
    assert summary["status"] == "completed" and summary["task"] == "classification"
    assert summary["final_val_accuracy"] > 0.85
    config = (Path(summary["run_dir"]) / "config.yaml").read_text()
    assert f"collate: given:{collate.__name__}" in config
    losses = [record["val_loss"] for record in records(summary["run_dir"], "eval")]
    assert len(losses) == 2 and 0 < losses[1] < losses[0] < 0.7
    printed = capsys.readouterr().out
    assert "val_loss" in printed and "samples_per_second" in printed
    assert "images_per_second" not in printed and "skipped_images" not in printed


def test_samples_of_different_lengths_without_a_collate_are_named(tmp_path, run_cli):
    with pytest.raises(DataError) as caught:
        hpctrain.fit(TextClassifier(), Sentences(512, 0), Sentences(256, 1),
                     output_dir=str(tmp_path), **QUICK)
    message = str(caught.value)
    assert message.startswith("data.dataset: given:Sentences: train samples 0 and 256 differ "
                              "in shape (inputs (24,) and (38,)), which torch's default "
                              "collation cannot stack: give a collate function that pads")
    assert "data.collate: file.py:pad" in message and "one shape in your dataset" in message
    code, out, err = run_cli("run", str(text_recipe(tmp_path)), "data.collate=null")
    assert code == 2 and err.count("\n") == 1 and "differ in shape (inputs (" in err


def test_a_batch_a_worker_cannot_stack_is_the_same_one_line(tmp_path):
    """The samples checked before training (first, middle, last) are of one length, the
    others not: the loader worker's failure reaches the run as that line, not torch's
    traceback from the worker ("Trying to resize storage that is not resizable"). The run's
    worker ends with it, though the error held here keeps the run's frames (as a notebook's
    last error does): it stayed idle in this process, and a later test's profile counted it."""
    before = set(loader_workers(os.getpid()))
    with pytest.raises(DataError) as caught:
        hpctrain.fit(TextClassifier(), Uneven(512, 0), Uneven(256, 1), output_dir=str(tmp_path),
                     **{**QUICK, "data": {"num_workers": 1}})
    message = str(caught.value)
    assert message.startswith("data.dataset: given:Uneven: two samples of a batch differ in "
                              "shape (inputs (") and "\n" not in message
    assert "Traceback" not in message and "worker" not in message
    assert caught.value.__traceback__ is not None
    assert [p for p in set(loader_workers(os.getpid())) - before if running(p)] == []


def test_a_collate_whose_batch_has_no_target_is_named(tmp_path):
    with pytest.raises(DataError, match=r"data.collate given:ids_only made a batch that is a "
                                        r"Tensor, not \(inputs, target\)"):
        hpctrain.fit(TextClassifier(), Sentences(256, 0), Sentences(64, 1),
                     collate_fn=ids_only, output_dir=str(tmp_path), task="classification",
                     **QUICK)


def ids_only(samples):
    return pad_collate(samples)[0]["input_ids"]


def test_bucketing_batches_a_classifier_by_length_and_says_the_padding_saved(tmp_path, capsys):
    """data.bucketing on a classification task: batches of similar lengths, the padding of
    an epoch's batches against random batches' in the banner; the dataset's `lengths`
    spares reading every sample. The evaluation batch is data.val_batch_size."""
    sizes = []

    def counting(samples):
        sizes.append(len(samples))
        return pad_collate(samples)
    torch.manual_seed(0)
    summary = hpctrain.fit(TextClassifier(), Sentences(1024, 0, with_lengths=True),
                           Sentences(256, 1), collate_fn=counting, output_dir=str(tmp_path),
                           **{**QUICK, "data": {"num_workers": 0, "bucketing": True,
                                                "val_batch_size": 50}})
    out = capsys.readouterr().out
    said = next(line for line in out.splitlines() if "data.bucketing:" in line)
    bucketed, random = (float(part.split("%")[0].split()[-1]) for part in said.split("padding"))
    assert bucketed < 10 < 30 < random
    assert "lengths in" not in out  # the dataset said them
    assert summary["status"] == "completed" and summary["final_val_accuracy"] > 0.85
    assert sizes.count(50) == 2 * 5 and sizes.count(6) == 2  # 256 = 5 x 50 + 6, per evaluation
    with pytest.raises(ConfigError, match="data.bucketing batches samples of different "
                                          "lengths, which need a collate function"):
        hpctrain.fit(TextClassifier(), Sentences(64, 0, fixed=16), Sentences(64, 1, fixed=16),
                     output_dir=str(tmp_path), data={"bucketing": True},
                     train={"batch_size": 8})
    summary = hpctrain.fit(  # your DataLoader's collate pads as well
        TextClassifier(), DataLoader(Sentences(256, 0), batch_size=32, collate_fn=pad_collate),
        DataLoader(Sentences(64, 1), batch_size=32, collate_fn=pad_collate),
        output_dir=str(tmp_path), **{**QUICK, "train": {"epochs": 1},
                                     "data": {"num_workers": 0, "bucketing": True}})
    assert summary["steps"] == 8 and "data.bucketing: batches of similar lengths" in \
        capsys.readouterr().out


def test_memory_profile_and_bench_data_take_a_recipe_with_your_collate(tmp_path, run_cli):
    """memory's batch is your collate's batch of the longest sample read, said in its notes;
    measured on the CPU, it is what was predicted."""
    recipe = str(text_recipe(tmp_path))
    code, out, err = run_cli("memory", recipe, "device=cpu", "--gpu-memory", "1GiB",
                             "--measure", "--json")
    assert code == 0, err
    report = json.loads(out)
    longest = max(len(Sentences(1024, 0)[i][0]) for i in (0, 512, 1023))
    assert report["estimate"]["input_shape"] == [longest]
    assert any(f"(length {longest}, the longest of samples 0, 512, 1023) made by data.collate"
               in note for note in report["estimate"]["notes"])
    assert abs(report["measured"]["relative_error"]) < 0.05
    code, out, err = run_cli("profile", recipe, "--steps", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["verdict"]["bound"]
    code, out, err = run_cli("bench", "data", recipe, "--seconds", "0.3", "--workers", "1",
                             "--prefetch", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["best"]["samples_per_second"] > 0


@pytest.mark.parametrize("override, message", [
    ("data.collate=pad_collate", "data.collate = 'pad_collate': Value error, your collate "
                                 "function: package.module:fn or path/to/file.py:fn"),
    ("data.dataset=shapes", "data.collate applies to your own dataset (data.dataset: "
                            "file.py:make); 'shapes' is batched by hpctrain")])
def test_a_collate_setting_that_cannot_be_used_is_one_line(tmp_path, run_cli, override,
                                                           message):
    code, _, err = run_cli("run", str(text_recipe(tmp_path)), override)
    assert code == 2 and message in err and "Traceback" not in err, err


def test_bad_collate_arguments_and_lengths_are_named(tmp_path):
    with pytest.raises(ConfigError, match="fit\\(collate_fn=...\\): a function of a list of "
                                          "samples, not a int"):
        hpctrain.fit(TextClassifier(), Sentences(64, 0), collate_fn=5)
    wrong = Sentences(256, 0, with_lengths=True)
    wrong.lengths = wrong.lengths[:-1]
    with pytest.raises(DataError, match="its `lengths` has 255 entries for 256 samples: one "
                                        "length per sample"):
        hpctrain.fit(TextClassifier(), wrong, Sentences(64, 1), collate_fn=pad_collate,
                     output_dir=str(tmp_path), **{**QUICK, "data": {"num_workers": 0,
                                                                     "bucketing": True}})
