"""Pretrained weights, offline first (issue 40): the tests that train, in this process or in an
`hpctrain` process of their own (the others are tests/unit/test_pretrained.py,
tests/cluster/test_pretrained.py)."""

from __future__ import annotations

import subprocess

import pytest

from hostile import plant_hostile_weights
from tiny_models import _tiny_gpt2
from warm_starts import AddressSpaceLimit


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


def _limited_run(*args: str) -> subprocess.CompletedProcess:
    """`hpctrain ARGS` in a child of 8 GiB of address space (what `memory` reserves for its
    fake tensors): an allocation of terabytes fails there, should a defence break, not on
    the machine."""
    import sys

    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True,
                          text=True, timeout=300, preexec_fn=AddressSpaceLimit(8 << 30))


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
    # under the child's 8 GiB, the tightest bound is its address space, named (issue 69)
    assert "GiB of memory the process's address-space limit (ulimit -v 8.0 GiB" in last, last
    if len(kwargs) == 1:
        return  # memory's path checked on the larger, past int64 (its count and bytes)
    done = _limited_run("memory", "tiny-lm", *recipe)  # measured on this CPU, it would be built
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "GiB available here: it does not fit" in last or words in last, last
