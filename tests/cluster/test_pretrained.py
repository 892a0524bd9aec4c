"""Pretrained weights, offline first (issue 40): the tests that start several processes or a
server (torchrun, Slurm, PostgreSQL, the browser, the model hub) (the others are
tests/unit/test_pretrained.py, tests/runs/test_pretrained.py)."""

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

from hostile import plant_hostile_weights

from hpctrain.models.model_names import build_model
from tiny_models import _tiny_gpt2

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
    model = ["model.name=torchvision:" + TV, "model.pretrained=true", "data.images.image_size=32",
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
    model = ["model.name=torchvision:" + TV, "model.pretrained=true", "data.images.image_size=32"]
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
                                                   "data.images.image_size=32"))
    assert code == 2 and err.count("\n") == 1, err
    assert f"the cached weights {weights_server['cache']} cannot be read (a pickle" in err
    assert ("would run posix.system" in err) == torch_save and "refused" in err
    assert not marker.exists()


def test_a_frozen_backbone_stays_and_the_pretrained_part_trains_slower(weights_server, run_cli,
                                                                       tiny):
    """model.freeze leaves the first layers as loaded; optim.pretrained_lr_scale=0.1 puts the
    other pretrained layers in groups at a tenth of the head's rate; memory counts no
    gradients for the frozen ones."""
    from hpctrain.config import load_config
    from hpctrain.memory.estimate import estimate, resolve_target
    from hpctrain.train.optimizers.optim import build_optimizer, freeze

    model = ["model.name=torchvision:" + TV, "model.pretrained=true", "data.images.image_size=32",
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


@pytest.mark.parametrize("lie, words", [
    ("hash", "the file's sha256 hash is"),
    ("more", "the server sent more than the"),
    ("short", "peer closed connection without sending complete message body"),
    ("loop", "more than 5 redirects (a loop?); nothing kept"),
    ("slow headers", "slower than 1,024 bytes/s after 2 s (--min-rate, --grace); stopped, "
                     "nothing kept"),
    ("slow body", "slower than 1,024 bytes/s after 2 s"),
])
def test_prefetch_keeps_nothing_a_lying_hub_sends(tmp_path, lie, words):
    """A hub that sends other bytes than its hash, 1.5 GB after a file it lists as small, a
    body cut short, a redirect loop, or its answer a byte at a time: prefetch stops (at the
    first byte past the promise, at the pace's end), keeps nothing and says so in one line,
    exit 1 (before: kept with exit 0, the whole 1.5 GB in the cache, an httpx traceback, or a
    wait without end beside a .partial blob)."""
    import time

    from hub_server import StandInHub

    _tiny_gpt2(tmp_path / "served" / "lab" / "tiny-gpt")
    cache = tmp_path / "hub"
    hub = StandInHub(tmp_path / "served", {"model.safetensors": lie})
    started = time.monotonic()
    with hub as url:
        done = subprocess.run(["hpctrain", "prefetch", "tiny-lm", "model.name=hf:lab/tiny-gpt",
                               "--min-rate", "1k", "--grace", "2"],
                              text=True, capture_output=True, timeout=300,
                              env={**os.environ, "HF_ENDPOINT": url, "HF_HUB_CACHE": str(cache)})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    if lie.startswith("slow"):  # the pace's end: 2 s and the bytes that came, not 120 s
        assert time.monotonic() - started < 60
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hpctrain: error: cannot fetch hf:lab/tiny-gpt's config, weights "
                           "and tokenizer: ") and words in last, last
    assert "model.safetensors" in last and "nothing kept" in last, last
    kept = [p for p in cache.rglob("*") if p.is_file() or p.is_symlink()]
    assert not any(p.name == "model.safetensors" or ".partial" in p.name for p in kept), kept
    assert sum(p.stat().st_size for p in kept if p.is_file()) < 1 << 20
    if lie == "more":  # stopped early: the hub wrote little of its 1.5 GB before the close
        assert hub.sent["model.safetensors"] < 256 << 20, hub.sent
