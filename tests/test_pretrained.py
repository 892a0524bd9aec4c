"""Pretrained weights, offline first (issue 40): read from torchvision's and timm's caches,
the head replaced for the data's classes and named; missing or damaged weights are one line
naming `hpctrain prefetch`, which fills the cache from a local HTTP server standing in for
download.pytorch.org (the tests have no internet)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import subprocess
import threading
from pathlib import Path

import pytest
import torch
import torchvision

from hostile import FALSE_SAFETENSORS, plant_hostile_weights

from hpctrain.models.model_names import build_model

TV = "shufflenet_v2_x0_5"  # torchvision's smallest classifier with a Linear head (fc)


@pytest.fixture
def weights_server(tmp_path, monkeypatch):
    """Random shufflenet weights served over HTTP under torch.hub's name for them (its
    SHA-256 prefix), the model's weights URL pointed there, TORCH_HOME empty."""
    torch.manual_seed(0)
    buffer = io.BytesIO()
    state = torchvision.models.get_model(TV).state_dict()
    torch.save(state, buffer)
    data = buffer.getvalue()
    name = f"shufflenetv2_x0.5-{hashlib.sha256(data).hexdigest()[:10]}.pth"
    served = tmp_path / "served"
    served.mkdir()
    (served / name).write_bytes(data)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    weights = torchvision.models.get_model_weights(TV).DEFAULT
    monkeypatch.setattr(weights.value, "url", f"http://127.0.0.1:{server.server_port}/{name}")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    yield {"state": state, "name": name, "data": data,
           "cache": tmp_path / "torch_home" / "hub" / "checkpoints" / name}
    server.shutdown()


def test_pretrained_weights_come_from_the_cache_that_prefetch_fills(weights_server, run_cli,
                                                                    tiny, capsys):
    model = ["model.name=torchvision:" + TV, "model.pretrained=true", "data.image_size=32",
             "train.max_steps=2"]
    code, _, err = run_cli("run", "default", *tiny(*model))
    assert code == 2 and err.count("\n") == 1
    assert "the weights of torchvision:shufflenet_v2_x0_5 (IMAGENET1K_V1) are not in" in err
    assert "hpctrain prefetch RECIPE" in err

    code, out, err = run_cli("prefetch", "default", *tiny(*model))
    assert code == 0, err
    assert out.strip() == f"torchvision:{TV} pretrained weights: {weights_server['cache']}"
    assert weights_server["cache"].read_bytes() == weights_server["data"]

    built = build_model("torchvision:" + TV, 8, pretrained=True)
    assert built.fc.out_features == 8 and "fc replaced for 8 classes" in built.pretrained_note
    for key, value in weights_server["state"].items():
        if not key.startswith("fc."):
            assert torch.equal(built.state_dict()[key], value), key
    code, out, err = run_cli("run", "default", *tiny(*model))
    assert code == 0, err
    assert f"weights: pretrained IMAGENET1K_V1 from {weights_server['cache']}; fc replaced " \
           "for 10 classes (random start)" in out  # the shapes: 10


def test_damaged_weights_and_a_refused_download_are_one_line(weights_server, run_cli, tiny,
                                                             monkeypatch):
    model = ["model.name=torchvision:" + TV, "model.pretrained=true", "data.image_size=32"]
    cache: Path = weights_server["cache"]
    cache.parent.mkdir(parents=True)
    cache.write_bytes(weights_server["data"][:1000])
    code, _, err = run_cli("run", "default", *tiny(*model))
    assert code == 2 and err.count("\n") == 1
    assert f"the cached weights {cache} cannot be read" in err and "delete the file" in err
    cache.unlink()
    weights = torchvision.models.get_model_weights(TV).DEFAULT
    monkeypatch.setattr(weights.value, "url", weights.url.rsplit("/", 1)[0] + "/gone-0abc.pth")
    code, _, err = run_cli("prefetch", "default", *tiny(*model))
    assert code == 1 and "cannot fetch torchvision:shufflenet_v2_x0_5's pretrained weights" in err
    assert "the server answered 404" in err and not any(cache.parent.iterdir())


@pytest.mark.parametrize("torch_save", [True, False], ids=["torch.save", "plain pickle"])
def test_cached_weights_that_would_run_code_are_refused_and_never_run(weights_server, run_cli,
                                                                      tiny, tmp_path,
                                                                      torch_save):
    """torch.hub's loader reads with weights_only=False: a pickle planted in a shared
    TORCH_HOME would run in every job. It is refused in one line naming the file and what
    it would have run; the payload never runs."""
    marker = tmp_path / "payload-ran"
    plant_hostile_weights(weights_server["cache"], marker, torch_save)
    code, _, err = run_cli("run", "default", *tiny("model.name=torchvision:" + TV,
                                                   "model.pretrained=true",
                                                   "data.image_size=32"))
    assert code == 2 and err.count("\n") == 1, err
    assert f"the cached weights {weights_server['cache']} cannot be read (a pickle" in err
    assert ("would run posix.system" in err) == torch_save and "refused" in err
    assert not marker.exists()


def _hub_repo(cache: Path, repo: str) -> Path:
    """An empty snapshot folder of `repo` in a Hugging Face cache, as huggingface_hub lays
    one out (refs/main -> snapshots/<commit>)."""
    commit = "0" * 40
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    return folder / "snapshots" / commit


def test_an_hf_folders_pickled_weights_that_would_run_code_are_one_line(tmp_path, run_cli):
    marker = tmp_path / "payload-ran"
    _tiny_gpt2(tmp_path / "tiny")
    (tmp_path / "tiny" / "model.safetensors").unlink()
    plant_hostile_weights(tmp_path / "tiny" / "pytorch_model.bin", marker)
    code, _, err = run_cli("run", "tiny-lm", f"model.name=hf:{tmp_path / 'tiny'}",
                           "model.pretrained=true", f"output_dir={tmp_path / 'runs'}",
                           f"data.arithmetic.cache_dir={tmp_path}", "tensorboard=false")
    assert code == 2 and "Traceback" not in err, err  # above it: the libraries' own notes
    assert err.splitlines()[-1].startswith("hpctrain: error: model.pretrained: ")
    assert f"the weights in {tmp_path / 'tiny'} cannot be read (a pickle that would run " \
           "posix.system, not only tensors; refused)" in err
    assert not marker.exists()


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


def test_a_frozen_backbone_stays_and_the_pretrained_part_trains_slower(weights_server, run_cli,
                                                                       tiny):
    """model.freeze leaves the first layers as loaded; optim.pretrained_lr_scale=0.1 puts the
    other pretrained layers in groups at a tenth of the head's rate; memory counts no
    gradients for the frozen ones."""
    from hpctrain.config import load_config
    from hpctrain.memory.estimate import estimate, resolve_target
    from hpctrain.train.optimizers.optim import build_optimizer, freeze

    model = ["model.name=torchvision:" + TV, "model.pretrained=true", "data.image_size=32",
             "model.freeze=[conv1.*,stage2.*]", "optim.pretrained_lr_scale=0.1"]
    code, _, err = run_cli("prefetch", "default", *tiny(*model))
    assert code == 0, err
    config = load_config("default", tiny(*model))
    built = build_model(config.model.name, 10, pretrained=True)
    freeze(built, config.model.freeze)
    frozen = {n for n, p in built.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith(("conv1.", "stage2.")) for n in frozen)
    groups = build_optimizer(built, config.optim, 0.2, torch.device("cpu")).param_groups
    head = {id(p) for p in built.fc.parameters()}
    for group in groups:
        assert group["lr"] == pytest.approx(0.2 if id(group["params"][0]) in head else 0.02)
    assert sum(len(g["params"]) for g in groups) == sum(
        p.requires_grad for p in built.parameters())
    before = {n: p.detach().clone() for n, p in built.named_parameters()}
    optimizer = build_optimizer(built, config.optim, 0.2, torch.device("cpu"))
    torch.nn.functional.cross_entropy(built(torch.randn(4, 3, 32, 32)),
                                      torch.tensor([0, 1, 2, 3])).backward()
    optimizer.step()
    for name, param in built.named_parameters():
        assert torch.equal(param, before[name]) == (name in frozen), name
    code, out, err = run_cli("run", "default", *tiny(*model, "train.max_steps=2"))
    assert code == 0, err
    full = estimate(load_config("default", tiny(*model[:3])), resolve_target(config, "1GiB"))
    cut = estimate(config, resolve_target(config, "1GiB"))
    assert cut.footprint.at_peak["optimizer states"] < full.footprint.at_peak[
        "optimizer states"]
    with pytest.raises(Exception, match=r"model.freeze: 'layer9.\*' matches no parameter"):
        freeze(built, ["layer9.*"])


def test_the_fine_tuning_recipe_starts_from_imagenet_weights_and_names_prefetch(tmp_path,
                                                                                run_cli):
    from hpctrain.config import load_config

    config = load_config("finetune-resnet50", [f"data.path={tmp_path}"])
    assert config.model.name == "torchvision:resnet50" and config.model.pretrained
    assert config.optim.pretrained_lr_scale == 0.1
    code, out, _ = run_cli("recipes")
    assert code == 0 and "finetune-resnet50  Fine-tune an ImageNet-pretrained ResNet-50" in out


def _tiny_gpt2(folder: Path) -> dict:
    """A two-layer GPT-2 of a 300-token vocabulary, saved as transformers saves it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(2)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2,
                                       n_head=2))
    model.save_pretrained(folder)
    return {k: v.clone() for k, v in model.state_dict().items()}


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


def test_prefetch_fills_the_hub_cache_from_a_stand_in_hub_and_a_run_reads_it(tmp_path, run_cli,
                                                                            monkeypatch):
    """hf:lab/tiny-gpt: prefetch downloads its config and weights from a local server standing
    in for huggingface.co into the cache; tiny-lm then fine-tunes it offline for two steps."""
    from huggingface_hub import constants
    from hub_server import StandInHub

    state = _tiny_gpt2(tmp_path / "served" / "lab" / "tiny-gpt")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    recipe = ["model.name=hf:lab/tiny-gpt", "model.pretrained=true",
              f"output_dir={tmp_path / 'runs'}", f"data.arithmetic.cache_dir={tmp_path}",
              "data.arithmetic.num_train=200", "data.arithmetic.num_val=20",
              "data.tokens.seq_len=32", "train.batch_size=4", "train.max_steps=2",
              "data.num_workers=0", "tensorboard=false", "report=false"]
    with StandInHub(tmp_path / "served") as url:  # a login node's command, as users type it
        done = subprocess.run(["hpctrain", "prefetch", "tiny-lm", *recipe], text=True,
                              capture_output=True, env={**os.environ, "HF_ENDPOINT": url,
                                                        "HF_HUB_CACHE": str(tmp_path / "hub")})
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert out.startswith("hf:lab/tiny-gpt config, weights and tokenizer: ")
    snapshot = Path(out.split(": ", 1)[1].strip())
    assert {"config.json", "model.safetensors"} <= {p.name for p in snapshot.iterdir()}
    loaded = build_model("hf:lab/tiny-gpt", None, vocab_size=300, pretrained=True)
    assert torch.equal(loaded.model.lm_head.weight, state["lm_head.weight"])
    code, out, err = run_cli("run", "tiny-lm", *recipe)
    assert code == 0, err


def test_prefetch_fetches_timm_weights_from_a_stand_in_hub(tmp_path, monkeypatch):
    """timm:resnet10t's weights live on the hub as timm/resnet10t.c3_in1k: prefetch, run as
    a command against the stand-in, puts them where a run then finds them offline."""
    import timm
    from huggingface_hub import constants
    from hub_server import StandInHub
    from safetensors.torch import save_file

    torch.manual_seed(3)
    state = timm.create_model("resnet10t").state_dict()
    served = tmp_path / "served" / "timm" / "resnet10t.c3_in1k"
    served.mkdir(parents=True)
    save_file(state, served / "model.safetensors")
    recipe = ["model.name=timm:resnet10t", "model.pretrained=true"]
    with StandInHub(tmp_path / "served") as url:
        done = subprocess.run(["hpctrain", "prefetch", "default", *recipe], text=True,
                              capture_output=True, env={**os.environ, "HF_ENDPOINT": url,
                                                        "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("timm:resnet10t pretrained weights: " + str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    built = build_model("timm:resnet10t", 4, pretrained=True)
    assert torch.equal(built.conv1[0].weight, state["conv1.0.weight"])
    assert built.fc.out_features == 4


def test_prefetch_of_a_recipe_that_reads_nothing_from_the_internet_says_so(run_cli):
    code, out, _ = run_cli("prefetch", "default")
    assert code == 0 and "nothing to fetch: recipe default reads nothing from the internet" in out
    code, out, _ = run_cli("prefetch", "default", "--json")
    assert code == 0 and out.strip() == "[]"


def _limited_run(*args: str) -> subprocess.CompletedProcess:
    """`hpctrain ARGS` in a child of 8 GiB of address space (what `memory` reserves for its
    fake tensors): an allocation of terabytes fails there, should a defence break, not on
    the machine."""
    import resource
    import sys

    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True,
                          text=True, timeout=300, preexec_fn=lambda: resource.setrlimit(
                              resource.RLIMIT_AS, (8 << 30, 8 << 30)))


@pytest.mark.parametrize("kwargs, words", [
    (["model.kwargs.vocab_size=100000000000"], "3,200,000,027,520 parameters"),
    (["model.kwargs.n_layer=16", "model.kwargs.n_embd=268435456", "model.kwargs.n_head=1"],
     "13,835,058,209,364,115,456 parameters"),  # past int64, as are its bytes
])
def test_an_hf_config_too_large_to_build_does_not_fit_counted_on_the_meta_device(
        tmp_path, kwargs, words):
    """A config of 10^11 words or 16 layers of width 2^28: `run` and `memory` count it on
    the meta device and say it does not fit (exit 3), where building it was an allocation
    traceback (issue 51)."""
    from transformers import GPT2Config

    GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2) \
        .save_pretrained(tmp_path / "gpt")
    recipe = [f"model.name=hf:{tmp_path / 'gpt'}", *kwargs, f"output_dir={tmp_path / 'runs'}",
              f"data.arithmetic.cache_dir={tmp_path}", "data.arithmetic.num_train=200",
              "data.arithmetic.num_val=20", "data.tokens.seq_len=32", "train.batch_size=4",
              "data.num_workers=0"]
    done = _limited_run("run", "tiny-lm", *recipe)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hpctrain: error: model.name hf:{tmp_path / 'gpt'}: {words}")
    assert "GiB of memory available here" in last
    if len(kwargs) == 1:
        return  # memory's path checked on the larger, past int64 (its count and bytes)
    done = _limited_run("memory", "tiny-lm", *recipe)  # measured on this CPU, it would be built
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "GiB available here: it does not fit" in last or words in last, last


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


@pytest.mark.parametrize("lie, words", [
    ("hash", "the file's sha256 hash is"),
    ("more", "the server sent more than the"),
    ("short", "peer closed connection without sending complete message body"),
    ("loop", "TooManyRedirects"),
])
def test_prefetch_keeps_nothing_a_lying_hub_sends(tmp_path, lie, words):
    """A hub that sends other bytes than its hash, 1.5 GB after a file it lists as small, a
    body cut short, or a redirect loop: prefetch stops (at the first byte past the promise),
    keeps nothing and says so in one line, exit 1 (before: kept with exit 0, the whole 1.5 GB
    in the cache, or an httpx traceback)."""
    from hub_server import StandInHub

    _tiny_gpt2(tmp_path / "served" / "lab" / "tiny-gpt")
    cache = tmp_path / "hub"
    hub = StandInHub(tmp_path / "served", {"model.safetensors": lie})
    with hub as url:
        done = subprocess.run(["hpctrain", "prefetch", "tiny-lm", "model.name=hf:lab/tiny-gpt"],
                              text=True, capture_output=True, timeout=300,
                              env={**os.environ, "HF_ENDPOINT": url, "HF_HUB_CACHE": str(cache)})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hpctrain: error: cannot fetch hf:lab/tiny-gpt's config, weights "
                           "and tokenizer: ") and words in last, last
    assert "model.safetensors" in last and "nothing kept" in last, last
    kept = [p for p in cache.rglob("*") if p.is_file() or p.is_symlink()]
    assert not any(p.name == "model.safetensors" or ".partial" in p.name for p in kept), kept
    assert sum(p.stat().st_size for p in kept if p.is_file()) < 1 << 20
    if lie == "more":  # stopped early: the hub wrote little of its 1.5 GB before the close
        assert hub.sent["model.safetensors"] < 256 << 20, hub.sent
