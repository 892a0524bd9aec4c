"""The task registry (tasks/): what every room asks instead of a task's name."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config import DataConfig, load_config
from hpctrain.models.model_names import build_model, check_model_takes
from hpctrain.tasks import registry


@pytest.mark.parametrize("name", registry.NAMES)
def test_each_task_s_default_model_takes_its_data(name):
    spec = registry.spec(name)
    check_model_takes(spec.default_model, spec.data_kind)  # refused with a ConfigError if not
    tokens = spec.data_kind == "tokens"
    with torch.device("meta"):
        model = build_model(spec.default_model, None if tokens else 10, {},
                            vocab_size=256 if tokens else None,
                            points=spec.data_kind == "points")
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
    assert registry.TASK_OF_DATA == {"images": "image_classification",
                                     "tokens": "language_modeling",
                                     "points": "point_cloud_classification"}
    assert registry.for_data("tokens") is registry.spec("language_modeling")
    names = [curve.key for curve in registry.task_curves()]
    assert len(names) == len(set(names)) and "val_perplexity" in names
