"""The task registry (tasks/): what every room asks instead of a task's name."""

from __future__ import annotations

from functools import reduce

import pytest
import torch

from hpctrain.config import DataConfig, load_config
from hpctrain.models.model_names import build_model, check_model_takes
from hpctrain.tasks import registry
from hpctrain.tasks.spec import Measured
from hpctrain.tasks.tensors import KIND as TENSORS


@pytest.mark.parametrize("name", registry.NAMES)
def test_each_task_s_default_model_takes_its_data(name):
    spec = registry.spec(name)
    if spec.data_kind == TENSORS:  # your own tensors: no model of hpctrain's could know them
        assert spec.default_model == "" and spec.sample_size is None
        return
    check_model_takes(spec.default_model, spec.data_kind)  # refused with a ConfigError if not
    tokens = spec.data_kind == "tokens"
    with torch.device("meta"):
        model = build_model(spec.default_model, None if tokens else 10, {},
                            vocab_size=256 if tokens else None, kind=spec.data_kind)
    assert (getattr(model, "vocab_size", None) == 256) == tokens
    if tokens:  # the default model takes the default sequences (gpt_tiny's 128 did not)
        assert model.context >= DataConfig().tokens.seq_len
    assert spec.objective.split(":")[1] in ("max", "min")


@pytest.mark.parametrize("overrides, model", [
    ([], "hpctrain:resnet_small"),
    (["data.dataset=arithmetic"], "hpctrain:gpt_mini"),
    (["data.dataset=shapes3d"], "hpctrain:pointnet_small"),
])
def test_a_recipe_that_names_no_model_gets_its_task_s_default(overrides, model):
    """Before, every task defaulted to an image model: token data without model.name was
    refused ("not a language model")."""
    config = load_config("default", [*overrides, "model.name=auto"])
    assert config.model.name == model


def test_auto_picks_the_first_task_registered_for_the_data_s_kind():
    """Each registered kind's task is the first registered that learns from it (derived,
    so a kind added with its task needs no edit here); images' is image classification,
    not the segmentation registered after it."""
    from hpctrain.data import kinds

    assert set(registry.TASK_OF_DATA) == set(kinds.KINDS)
    for kind, name in registry.TASK_OF_DATA.items():
        assert name == next(n for n in registry.NAMES if registry.spec(n).data_kind == kind)
    assert registry.TASK_OF_DATA["images"] == "image_classification"
    assert registry.for_data("tokens") is registry.spec("language_modeling")
    names = [curve.key for curve in registry.task_curves()]
    assert len(names) == len(set(names)) and "val_perplexity" in names


MEASURED = Measured(samples_per_second=10.0, units_per_second=2560.0, best_val_loss=1.0,
                    final_eval=None, padding_fraction=0.0, parameters=1000, mfu=0.5,
                    mfu_peak="spec bf16", mfu_formula="6N")


@pytest.mark.parametrize("name", registry.NAMES)
def test_each_task_s_summary_figures_and_size_setting_come_from_its_spec(name):
    """summary.json's task figures (images_per_second for every task, the language figures
    for a language model) and the setting out-of-memory advice names are the spec's."""
    spec = registry.spec(name)
    figures = spec.figures(MEASURED)
    images = spec.data_kind == "images"
    assert figures["images_per_second"] == (10.0 if images else None)
    assert ("tokens_per_second" in figures) == (spec.flops_per_unit is not None)
    assert spec.sample_size is None if spec.data_kind == TENSORS else \
        isinstance(reduce(getattr, spec.sample_size.split("."), load_config("default")), int)
    if spec.flops_per_unit:
        assert figures["tokens_per_second"] == 2560.0 and figures["mfu"] == 0.5
        assert figures["best_val_perplexity"] == pytest.approx(2.718281828)
