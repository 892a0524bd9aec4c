"""What Hugging Face's Trainer is given, as fit takes it (hf_trainer.py): each field of
TrainingArguments translated or refused by name; the Trainer's schedules step for step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hpctrain
from hpctrain.config import ScheduleConfig
from hpctrain.errors import ConfigError
from hpctrain.hf_trainer import ColumnsTaken, translate
from hpctrain.train.optimizers.optim import lr_multiplier
from hpctrain.train.validation.predictions import _joined
from hf_text import text_task


def _arguments(**fields):
    from transformers import TrainingArguments

    return TrainingArguments("unused", **{"report_to": "none", **fields})


def test_the_trainer_s_defaults_become_hpctrain_s_settings():
    """A script that sets nothing trains as the Trainer would: AdamW (fused) at 5e-5, a
    linear decay, clipping at 1.0, 3 epochs, seed 42, fp32, no evaluation until the end,
    a checkpoint every 500 steps."""
    settings = translate(_arguments(), steps_per_epoch=40)
    assert settings == {**settings, "optim.name": "adamw", "optim.fused": True,
                        "optim.lr": 5e-5, "optim.eps": 1e-8, "optim.weight_decay": 0.0,
                        "optim.grad_clip_norm": 1.0, "optim.lr_scaling": "none",
                        "schedule.name": "linear", "schedule.warmup_steps": 0,
                        "schedule.warmup_from_zero": True, "train.epochs": 3.0, "seed": 42,
                        "train.max_steps": None, "precision": "fp32", "compile": False,
                        "train.log_every": 500, "train.eval_every_epochs": 1e6,
                        "checkpoint.every_steps": 500, "tracking.sinks": []}


def test_each_field_without_a_meaning_here_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"hpctrain has no meaning for (eval_delay=2|"
                                          r"ignore_data_skip=True), (eval_delay=2|"
                                          r"ignore_data_skip=True): leave them"):
        translate(_arguments(eval_delay=2, ignore_data_skip=True), 10)
    with pytest.raises(ConfigError, match="lr_scheduler_type='polynomial'"):
        translate(_arguments(lr_scheduler_type="polynomial"), 10)
    with pytest.raises(ConfigError, match="optim='adafactor'"):
        translate(_arguments(optim="adafactor"), 10)
    with pytest.raises(ConfigError, match="report_to=.*not comet_ml"):
        translate(_arguments(report_to=["comet_ml"]), 10)


def test_a_ratio_and_epoch_intervals_count_in_the_run_s_steps():
    settings = translate(_arguments(warmup_steps=0.1, num_train_epochs=2, eval_strategy="epoch",
                                    save_strategy="epoch", logging_strategy="epoch",
                                    save_total_limit=2, bf16=True, use_cpu=True),
                         steps_per_epoch=45)
    assert settings["schedule.warmup_steps"] == 9  # ceil(0.1 x 90)
    assert (settings["train.eval_every_epochs"], settings["checkpoint.every_epochs"],
            settings["train.log_every"], settings["checkpoint.keep_last"],
            settings["precision"]) == (1, 1, 45, 2, "bf16")


def test_what_only_the_trainer_takes_is_refused_by_name():
    model, train, val, collate = text_task(train=8, val=4)
    with pytest.raises(ConfigError, match=r"fit\(model_init=...\): hpctrain takes no "
                                          "model_init: build the model before calling fit"):
        hpctrain.fit(model, train_dataset=train, model_init=lambda: model)
    with pytest.raises(ConfigError, match="give train_data or train_dataset .*, not both"):
        hpctrain.fit(model, train, train_dataset=train)
    with pytest.raises(ConfigError, match="compute_metrics=...\\): a function of the "
                                          "predictions and labels, not a str"):
        hpctrain.fit(model, train, val, compute_metrics="accuracy")


@pytest.mark.parametrize("kind, theirs", [("linear", "get_linear_schedule_with_warmup"),
                                          ("cosine", "get_cosine_schedule_with_warmup")])
def test_the_schedules_step_as_the_trainer_s(kind, theirs):
    import transformers

    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = getattr(transformers, theirs)(optimizer, num_warmup_steps=4,
                                             num_training_steps=20)
    expected = [schedule.lr_lambdas[0](step) for step in range(22)]
    ours = ScheduleConfig(name=kind, warmup_steps=4, warmup_from_zero=True)
    assert [lr_multiplier(ours, step, 20, 10) for step in range(22)] == \
        pytest.approx(expected, abs=1e-12)


def test_the_columns_the_model_does_not_take_are_left_out_before_your_collator():
    """The Trainer's remove_unused_columns: a text column beside the tokens."""
    seen = []
    collate = ColumnsTaken(lambda samples: seen.extend(samples), frozenset({"ids", "labels"}))
    collate([{"ids": [1], "labels": 0, "text": "a b"}])
    assert seen == [{"ids": [1], "labels": 0}]


def test_predictions_of_different_lengths_are_padded_as_the_trainer_pads_them():
    joined = _joined([torch.zeros(2, 3), torch.ones(1, 5)])
    assert joined.shape == (3, 5) and joined[0, 3:].tolist() == [-100, -100]


def test_fit_without_a_recipe_trains_a_hugging_face_model_with_the_trainer_s_defaults(capsys):
    """Before, a text model got the images' defaults (SGD at 0.1, batch 128), unsaid."""
    from hpctrain.api import _with_fit_defaults, load_config

    model = text_task(train=8, val=4)[0]
    mine = {"data.dataset": "given:Reviews", "model.name": "given:Bert"}
    config = _with_fit_defaults(load_config(None, task="classification", train={"epochs": 1},
                                            **mine), model)
    said = capsys.readouterr().out
    assert "fit's defaults for a Hugging Face model (the Trainer's): optim.name=adamw " \
           "optim.lr=5e-05" in said and "train.epochs" not in said  # yours stays yours
    assert (config.optim.name, config.optim.lr, config.schedule.name, config.train.batch_size,
            config.optim.grad_clip_norm, config.train.epochs) == \
        ("adamw", 5e-5, "linear", 8, 1.0, 1)
    plain = _with_fit_defaults(load_config(None, task="regression", **mine), nn.Linear(2, 1))
    assert "task regression's: optim.name=adamw optim.lr=0.001" in capsys.readouterr().out
    assert (plain.optim.name, plain.optim.lr) == ("adamw", 1e-3)


def test_a_stream_keeps_its_own_order_as_the_trainer_keeps_it():
    """A DataLoader refuses to shuffle an IterableDataset: the Trainer's random order
    leaves a stream as it comes."""
    from torch.utils.data import IterableDataset

    from hpctrain.hf_trainer import loaders

    class Stream(IterableDataset):
        def __iter__(self):
            yield from ({"x": torch.zeros(2), "labels": 0} for _ in range(4))

    train, val, by_length = loaders(_arguments(), nn.Linear(2, 2), Stream(), None, None)
    assert type(train.sampler).__name__ == "_InfiniteConstantSampler" and val is None
    assert not by_length
