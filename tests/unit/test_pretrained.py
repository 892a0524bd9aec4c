"""Pretrained weights, offline first (issue 40): read from torchvision's and timm's caches,
the head replaced for the data's classes and named; missing or damaged weights are one line
naming `hpctrain prefetch`, which fills the cache from a local HTTP server standing in for
download.pytorch.org (the tests have no internet).

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_pretrained.py, tests/cluster/test_pretrained.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hostile import FALSE_SAFETENSORS

from hpctrain.models.model_names import build_model
from tiny_models import _tiny_gpt2


def _hub_repo(cache: Path, repo: str) -> Path:
    """An empty snapshot folder of `repo` in a Hugging Face cache, as huggingface_hub lays
    one out (refs/main -> snapshots/<commit>)."""
    commit = "0" * 40
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    return folder / "snapshots" / commit


@pytest.mark.parametrize("lie", list(FALSE_SAFETENSORS))
def test_a_safetensors_file_whose_header_lies_is_one_line_naming_it(tmp_path, monkeypatch,
                                                                    lie):
    """A header of length 2^63, offsets past the end, a shape its offsets do not hold: in an
    hf: folder and in timm's weights in the hub cache, each refused naming the weights."""
    import timm
    from huggingface_hub import constants
    from safetensors.torch import save_file

    from hpctrain.errors import ConfigError

    _tiny_gpt2(tmp_path / "tiny")
    FALSE_SAFETENSORS[lie](tmp_path / "tiny" / "model.safetensors")
    with pytest.raises(ConfigError) as refused:
        build_model(f"hf:{tmp_path / 'tiny'}", None, vocab_size=300, pretrained=True)
    assert f"the weights in {tmp_path / 'tiny'} cannot be read (SafetensorError: " \
           in str(refused.value) and "\n" not in str(refused.value)

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    weights = _hub_repo(tmp_path / "hub", "timm/resnet10t.c3_in1k") / "model.safetensors"
    save_file(timm.create_model("resnet10t").state_dict(), weights)
    FALSE_SAFETENSORS[lie](weights)
    with pytest.raises(ConfigError) as refused:
        build_model("timm:resnet10t", 4, pretrained=True)
    assert f"the cached weights {weights} cannot be read (SafetensorError: " \
           in str(refused.value) and "\n" not in str(refused.value)


def test_timm_weights_are_read_from_the_hugging_face_cache(tmp_path, monkeypatch):
    """A hub cache laid out as huggingface_hub lays it out (refs/main -> snapshots/<commit>),
    holding random resnet10t weights: built from them, the head replaced."""
    import timm
    from huggingface_hub import constants
    from safetensors.torch import save_file

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(Exception, match=r"the weights of timm:resnet10t \(c3_in1k\) are not in "
                                        r"the Hugging Face cache .* hpctrain prefetch"):
        build_model("timm:resnet10t", 5, pretrained=True)
    torch.manual_seed(1)
    state = timm.create_model("resnet10t").state_dict()
    repo = tmp_path / "hub" / "models--timm--resnet10t.c3_in1k"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    save_file(state, repo / "snapshots" / commit / "model.safetensors")
    built = build_model("timm:resnet10t", 5, pretrained=True)
    assert built.fc.out_features == 5 and "fc replaced for 5 classes" in built.pretrained_note
    assert torch.equal(built.conv1[0].weight, state["conv1.0.weight"])


def test_pretrained_is_refused_where_no_library_has_weights():
    from hpctrain.config import load_config
    from hpctrain.errors import ConfigError

    with pytest.raises(ConfigError, match="hpctrain:tiny_cnn has no pretrained weights "
                                          "hpctrain can load"):
        load_config("default", ["model.name=hpctrain:tiny_cnn", "model.pretrained=true"])


def test_the_fine_tuning_recipe_starts_from_imagenet_weights_and_names_prefetch(tmp_path,
                                                                                run_cli):
    from hpctrain.config import load_config

    config = load_config("finetune-resnet50", [f"data.path={tmp_path}"])
    assert config.model.name == "torchvision:resnet50" and config.model.pretrained
    assert config.optim.pretrained_lr_scale == 0.1
    code, out, _ = run_cli("recipes")
    assert code == 0 and "finetune-resnet50  Fine-tune an ImageNet-pretrained ResNet-50" in out


def test_a_hugging_face_model_is_read_from_a_folder_or_the_hub_cache(tmp_path, monkeypatch):
    """hf:FOLDER with model.pretrained: the weights beside its config; hf:ORG/NAME: the same
    files in the Hugging Face cache (refs/main -> snapshots/<commit>), as prefetch leaves
    them; a name not in the cache is one line naming prefetch."""
    from huggingface_hub import constants

    from hpctrain.errors import ConfigError

    state = _tiny_gpt2(tmp_path / "tiny")
    loaded = build_model(f"hf:{tmp_path / 'tiny'}", None, vocab_size=300, pretrained=True)
    assert torch.equal(loaded.model.transformer.h[1].mlp.c_fc.weight,
                       state["transformer.h.1.mlp.c_fc.weight"])
    fresh = build_model(f"hf:{tmp_path / 'tiny'}", None, vocab_size=300)
    assert not torch.equal(fresh.model.transformer.h[1].mlp.c_fc.weight,
                           state["transformer.h.1.mlp.c_fc.weight"])

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match=r"no model lab/tiny-gpt in the Hugging Face cache "
                                          r".* hpctrain prefetch RECIPE"):
        build_model("hf:lab/tiny-gpt", None, vocab_size=300, pretrained=True)
    repo, commit = tmp_path / "hub" / "models--lab--tiny-gpt", "1" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots").mkdir()
    (tmp_path / "tiny").rename(repo / "snapshots" / commit)
    loaded = build_model("hf:lab/tiny-gpt", None, vocab_size=300, pretrained=True)
    assert torch.equal(loaded.model.lm_head.weight, state["lm_head.weight"])
    assert loaded.vocab_size == 300 and loaded.context == 64


def test_prefetch_of_a_recipe_that_reads_nothing_from_the_internet_says_so(run_cli):
    code, out, _ = run_cli("prefetch", "default")
    assert code == 0 and "nothing to fetch: recipe default reads nothing from the internet" in out
    code, out, _ = run_cli("prefetch", "default", "--json")
    assert code == 0 and out.strip() == "[]"


@pytest.mark.parametrize("option, value, words", [
    ("--min-rate", "0", "'0' is not a rate: give bytes a second, e.g. 500, 64k or 2M"),
    ("--min-rate", "fast", "'fast' is not a rate"), ("--min-rate", "nank", "is not a rate"),
    ("--grace", "-1", "'-1' is not a positive number of seconds")])
def test_a_pace_that_cannot_be_one_is_refused(run_cli, capsys, option, value, words):
    with pytest.raises(SystemExit) as stop:
        run_cli("prefetch", "default", option, value)
    assert stop.value.code == 2 and words in capsys.readouterr().err


def test_an_hf_config_of_the_wrong_type_or_nested_deep_is_one_line(tmp_path, run_cli):
    from transformers import GPT2Config

    from hpctrain.errors import ConfigError

    GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2) \
        .save_pretrained(tmp_path / "gpt")
    with pytest.raises(ConfigError, match=r"model.kwargs.n_layer = nan: the gpt2 config's "
                                          r"n_layer is a whole number \(2\)"):
        build_model(f"hf:{tmp_path / 'gpt'}", None, {"n_layer": float("nan")}, vocab_size=300)
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "config.json").write_text(
        '{"model_type": "gpt2", "a": ' + "[" * 200000 + "]" * 200000 + "}")
    with pytest.raises(ConfigError, match="its config.json is not a config transformers can "
                                          r"read \(config.json is nested deeper than 64"):
        build_model(f"hf:{tmp_path / 'deep'}", None, vocab_size=300)
    # issue 69: NaN in the file (JSON has none; Python's reader takes it), a field of the
    # wrong type (huggingface_hub's strict check): one line each, where both were tracebacks
    import json

    written = json.loads((tmp_path / "gpt" / "config.json").read_text())
    for field, value, said in (("n_embd", float("nan"), r"n_embd is nan: a config's numbers "
                                                        "are finite"),
                               ("layer_norm_epsilon", float("inf"), "layer_norm_epsilon is inf"),
                               ("n_embd", "wide", "n_embd")):
        (tmp_path / "crafted").mkdir(exist_ok=True)
        (tmp_path / "crafted" / "config.json").write_text(json.dumps({**written, field: value}))
        with pytest.raises(ConfigError, match="its config.json is not a config transformers "
                                              rf"can read \(.*{said}"):
            build_model(f"hf:{tmp_path / 'crafted'}", None, vocab_size=300)


@pytest.mark.parametrize("entry", [
    {"path": "../../victim.txt"}, {"path": "/etc/passwd"}, {"path": "a/./b"}, {"path": ""},
    {"path": "config.json", "size": -1}, {"path": "config.json", "oid": "not-a-hash"},
    {"path": "w.safetensors", "lfs": {"oid": "ab" * 20, "size": 5}},  # a sha1 for a sha256
    {"path": "w.safetensors", "lfs": "yes"}])
def test_a_hub_listing_entry_that_cannot_be_a_file_of_the_repository_is_refused(entry):
    """A crafted listing's path would put a file outside the snapshot (the cache's own
    folders, or anywhere the user can write); its size and hashes are what the download is
    held to. Each is refused before anything is fetched."""
    from hpctrain.errors import FetchFailed
    from hpctrain.models.download import _listed

    listed = {"type": "file", "path": "config.json", "size": 10, "oid": "a" * 40, **entry}
    with pytest.raises(FetchFailed, match="the hub lists a file it cannot be"):
        _listed(listed, "http://hub/api/models/lab/x/tree/c")
    good = _listed({"type": "file", "path": "sub/config.json", "size": 10, "oid": "a" * 40},
                   "http://hub")
    assert (good.path, good.promise.size, good.promise.algorithm) == ("sub/config.json", 10,
                                                                      "git")
