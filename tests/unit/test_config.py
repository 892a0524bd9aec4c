"""Recipes, overrides and the errors a user sees for a bad configuration.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_config.py."""

import json

import pytest
import yaml

from hpctrain.config import load_config, parse_override, shipped_recipes
from hpctrain.errors import ConfigError


def test_overrides_are_parsed_as_yaml_and_reach_nested_keys():
    config = load_config("default", ["train.batch_size=256", "precision=bf16",
                                     "optim.lr=1e-3", "data.augment.hflip=false",
                                     "model.kwargs={widths: [8, 16]}"])
    assert config.train.batch_size == 256
    assert config.precision == "bf16"
    assert config.optim.lr == pytest.approx(1e-3)
    assert config.data.augment.hflip is False
    assert config.model.kwargs == {"widths": [8, 16]}


def test_override_without_equals_sign_is_rejected():
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("train.batch_size")


@pytest.mark.parametrize("override, expected", [
    ("train.bach_size=64", "unknown key 'train.bach_size' (did you mean 'train.batch_size'?)"),
    ("train.batch_size=abc", "train.batch_size = 'abc'"),
    ("train.batch_size=0", "greater than or equal to 1"),
    ("precision=fp4",
     "precision = 'fp4': expected 'auto', 'fp32', 'tf32', 'fp16', 'bf16' or 'fp8'"),
    ("device=tpu", "device = 'tpu'"),
    ("data.augment.crop_scale=[0.9, 0.1]", "crop_scale must satisfy"),
    ("compile_cache=''", "compile_cache = ''"),
    ("data.tokens.width_buckets=65", "less than or equal to 64"),
    ("data.tokens.width_buckets=-1", "greater than or equal to 0"),
])
def test_bad_values_name_the_key_value_and_what_is_allowed(run_cli, override, expected):
    code, out, err = run_cli("config", "show", "default", override)
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_a_value_given_where_a_section_is_expected_is_explained(run_cli):
    code, _, err = run_cli("config", "show", "default", "train.epochs.max=3")
    assert code == 2 and "train.epochs is a value, not a section" in err


def test_unknown_recipe_suggests_the_close_one(run_cli):
    code, _, err = run_cli("config", "show", "defualt")
    assert code == 2
    assert "unknown recipe 'defualt'" in err and "did you mean 'default'" in err


def test_recipe_file_with_a_typo_names_the_file_and_key(tmp_path, run_cli):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("train:\n  epochz: 3\n")
    code, _, err = run_cli("config", "show", str(recipe))
    assert code == 2
    assert str(recipe) in err and "train.epochz" in err and "train.epochs" in err


def test_missing_recipe_file_and_invalid_yaml(tmp_path, run_cli, monkeypatch):
    code, _, err = run_cli("config", "show", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml" in err and "does not exist" in err
    monkeypatch.chdir(tmp_path)  # a folder named as a shipped recipe (autotune's --dir) is none
    (tmp_path / "default").mkdir()
    assert load_config("default").name == "default"
    (tmp_path / "mine").mkdir()
    code, _, err = run_cli("config", "show", "mine")
    assert code == 2 and "recipe 'mine' is a folder, not a file" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [1, 2\n")
    code, _, err = run_cli("config", "show", str(broken))
    assert code == 2 and "not valid YAML" in err


def test_config_show_prints_the_resolved_configuration(run_cli):
    code, out, _ = run_cli("config", "show", "default", "train.epochs=3")
    assert code == 0
    resolved = yaml.safe_load(out)
    assert resolved["name"] == "default" and resolved["train"]["epochs"] == 3
    code, out, _ = run_cli("config", "show", "default", "--json")
    assert json.loads(out)["data"]["dataset"] == "shapes"


def test_recipes_lists_the_shipped_ones(run_cli):
    assert {"default", "imagenet-resnet50", "small-images"} <= set(shipped_recipes())
    code, out, _ = run_cli("recipes", "--json")
    names = {row["name"] for row in json.loads(out)}
    assert code == 0 and {"default", "imagenet-resnet50", "small-images"} <= names


def test_imagefolder_recipes_require_a_path(run_cli):
    code, _, err = run_cli("config", "show", "imagenet-resnet50")
    assert code == 2 and "data.path" in err
    config = load_config("imagenet-resnet50", ["data.path=/data/imagenet"])
    assert config.precision == "bf16" and config.channels_last is True
    assert config.optim.lr_scaling == "linear" and config.train.label_smoothing == 0.1
    assert config.schedule.name == "cosine" and config.schedule.warmup_epochs > 0


def test_a_batch_size_override_replaces_the_recipes_global_batch():
    assert load_config("default", []).train.global_batch_size == 128
    chosen = load_config("default", ["train.batch_size=64"]).train
    assert (chosen.batch_size, chosen.global_batch_size) == (64, None)
    both = load_config("default", ["train.batch_size=64", "train.global_batch_size=256"]).train
    assert both.global_batch_size == 256


def test_an_image_setting_under_its_old_name_is_read_as_the_new_one_and_said_once(
        tmp_path, capsys, monkeypatch):
    """Issue 66 moved the images' own settings into data.images: a recipe, an override or a
    Python setting that still says data.image_size trains as before, and is told the new name
    once per process."""
    from hpctrain.config import loading

    monkeypatch.setattr(loading, "_SAID", set())
    recipe = tmp_path / "old.yaml"
    recipe.write_text("data:\n  dataset: shapes\n  image_size: 24\n  on_bad_image: fail\n")
    config = load_config(str(recipe), ["data.mean=[0.5, 0.5, 0.5]"])
    again = load_config(str(recipe), settings={"data": {"std": [0.2, 0.2, 0.2]}})
    images = config.data.images
    assert (images.image_size, images.on_bad_image, images.mean) == (24, "fail", (0.5,) * 3)
    assert again.data.images.std == (0.2,) * 3 and again.data.images.image_size == 24
    assert config.told("data.images.image_size") and config.told("data.images.mean")
    said = capsys.readouterr().err.splitlines()
    assert said.count("hpctrain: data.image_size is now data.images.image_size (read as "
                      "data.images.image_size; write it so)") == 1
    assert sum("data.mean is now data.images.mean" in line for line in said) == 1
    assert any("data.std is now data.images.std" in line for line in said)


def test_an_image_setting_given_under_both_names_is_refused(tmp_path, run_cli):
    recipe = tmp_path / "both.yaml"
    recipe.write_text("data:\n  image_size: 24\n  images:\n    image_size: 32\n")
    code, _, err = run_cli("config", "show", str(recipe))
    assert code == 2
    assert "gives both data.image_size and data.images.image_size" in err
    assert "keep data.images.image_size" in err


def test_a_configuration_saved_under_the_old_names_reads_under_the_new_quietly(capsys):
    """What a checkpoint or an older run's config.yaml holds is compared with today's
    settings by name: data.image_size there is data.images.image_size here."""
    from hpctrain.config import current_names, flatten

    saved = {"data": {"dataset": "shapes", "image_size": 32, "decode": "cpu"}}
    now = flatten(current_names(saved))
    assert now == {"data.dataset": "shapes", "data.images.image_size": 32,
                   "data.images.decode": "cpu"}
    assert saved["data"]["image_size"] == 32  # the caller's own left as it was
    assert capsys.readouterr().err == ""
