"""Language modelling: the tests that train, in this process or in an `hpctrain` process of
their own (the others are tests/unit/test_language.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader

from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.tokens.token_pack import TokenBlocks, TokenPack
from hpctrain.errors import DataError
from hpctrain.models.gpt import gpt
from token_data import crafted_copy, hf_config, packed, stream_pack
from warm_starts import AddressSpaceLimit


@pytest.mark.parametrize("workers", [0, 2])
def test_blocks_through_batch_buffers_are_torch_dataloaders_to_the_bit(stream_pack, workers):
    """data.loader=auto reads token blocks into shared batch buffers (batch_buffers.py): the
    same batches as torch's DataLoader, training (shuffled, two epochs) and validation (padded
    to the ranks, its last batch short), on either of 2 ranks."""
    blocks = TokenBlocks(stream_pack.split("train"), seq_len=4)
    for rank, (shuffle, batch, drop_last) in ((0, (True, 3, True)), (1, (False, 4, False))):
        sampler = EpochSampler(len(blocks), 0, shuffle=shuffle, seed=5, rank=rank,
                               world_size=2, pad=not shuffle)
        buffered = BufferedLoader(blocks, sampler, batch, drop_last, workers, 0,
                                  prefetch_factor=2)
        torch_loader = DataLoader(blocks, batch_size=batch, sampler=sampler,
                                  drop_last=drop_last)
        for epoch in (0, 1):
            sampler.set_epoch(epoch, 0)
            got = [rows.clone() for rows in buffered]  # a buffer is reused later
            expected = list(torch_loader)
            assert len(got) == len(expected) == len(buffered) > 1
            assert all(a.dtype == torch.int32 and a.equal(b) for a, b in zip(got, expected))
        buffered.close()


def test_a_damaged_block_read_by_a_buffer_worker_is_named_in_the_training_process(
        stream_pack, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(stream_pack.root, copy)
    ids = np.fromfile(copy / "train-00000.bin", dtype="<u2")
    ids[9] = 60000  # in the third block of 4 (+1) tokens, which starts at 8
    ids.tofile(copy / "train-00000.bin")
    split = TokenPack(copy).split("train")
    blocks = TokenBlocks(split, seq_len=4)
    loader = BufferedLoader(blocks, EpochSampler(len(blocks), 0, shuffle=False), 2, True, 1, 0)
    with pytest.raises(DataError, match="train-00000.bin at 8: id 60000 is outside the "
                                        "vocabulary"):
        list(loader)
    loader.close()


# ---- training runs ---------------------------------------------------------------------------

LM = ["data.dataset=arithmetic", "data.arithmetic.num_train=3000",
      "data.arithmetic.num_val=40", "data.arithmetic.max_operand=30", "data.tokens.seq_len=32",
      "model.name=hpctrain:gpt_tiny", "model.kwargs.width=32", "model.kwargs.layers=1",
      "optim.name=adamw", "optim.lr=0.01", "optim.weight_decay=0.0", "schedule.name=constant",
      "data.num_workers=0", "tensorboard=false", "precision=fp32"]


def train_records(run: Path, kind: str = "train") -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


@pytest.fixture(scope="module")
def lm_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("arithmetic-cache")


def test_a_tiny_language_model_learns(tmp_path, run_cli, lm_cache):
    code, out, err = run_cli("run", "tiny-lm", *LM, f"data.arithmetic.cache_dir={lm_cache}",
                             f"output_dir={tmp_path}", "run_name=lm", "train.max_steps=300",
                             "train.log_every=10", "train.batch_size=32")
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "lm" / "summary.json").read_text())
    train = train_records(tmp_path / "lm")
    # from ln(257) = 5.5 at the start (uniform over the bytes) to below 1.6
    assert train[0]["loss"] > 3.0 and train[-1]["loss"] < 1.6, [r["loss"] for r in train]
    assert summary["task"] == "language_modeling" and summary["images_per_second"] is None
    assert summary["tokens_per_second"] == pytest.approx(32 * summary["samples_per_second"])
    assert summary["best_val_loss"] < 1.8
    assert summary["best_val_perplexity"] == pytest.approx(np.exp(summary["best_val_loss"]))
    assert set(summary["final_eval"]) == {"val_loss", "val_perplexity", "val_accuracy",
                                          "val_answer_accuracy"}
    assert "tok/s" in out + err and "tokens_per_second" in out


def lm_weights(checkpoint: Path) -> dict:
    state = {"model": gpt("tiny", vocab_size=257, width=32, layers=1).state_dict()}
    dcp.load(state, checkpoint_id=checkpoint)
    return state["model"]


@pytest.mark.parametrize("batching", ["blocks", "documents"])
def test_a_language_model_resumes_bitwise(tmp_path, run_cli, lm_cache, batching):
    common = [*LM, f"data.arithmetic.cache_dir={lm_cache}", f"output_dir={tmp_path}",
              f"data.tokens.batching={batching}", "train.max_steps=12", "train.log_every=1",
              "train.batch_size=8", "checkpoint.every_steps=6", "train.eval_every_epochs=100"]
    code, _, err = run_cli("run", "tiny-lm", *common, "run_name=straight")
    assert code == 0, err[-2000:]
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    code, _, err = run_cli("run", "tiny-lm", *common, "run_name=resumed",
                           f"resume={tmp_path / 'resumed' / 'checkpoints' / 'step_00000006'}")
    assert code == 0, err[-2000:]
    straight, resumed = train_records(tmp_path / "straight"), train_records(tmp_path / "resumed")
    assert [r["loss"] for r in straight[6:]] == [r["loss"] for r in resumed[-6:]]
    a = lm_weights(tmp_path / "straight" / "checkpoints" / "step_00000012")
    b = lm_weights(tmp_path / "resumed" / "checkpoints" / "step_00000012")
    assert all(torch.equal(a[k], b[k]) for k in a)
    if batching == "documents":
        assert 0 < json.loads((tmp_path / "resumed" / "summary.json").read_text())[
            "padding_fraction"] < 1


@pytest.mark.slow
def test_the_tiny_lm_recipe_learns_to_add(tiny_lm_recipe_run):
    """The README's promise: `hpctrain run tiny-lm` gets at least 90 % of held-out answers
    entirely right, with nothing downloaded (about 90 s on two CPU cores; the session trains
    it beside the other recipes, tests/shipped_recipes.py)."""
    _, summary = tiny_lm_recipe_run
    assert summary["final_eval"]["val_answer_accuracy"] >= 0.9, summary["final_eval"]
    assert summary["best_val_perplexity"] < 3.5


def token_run(tmp_path, pack: Path, *extra: str) -> list[str]:
    return ["data.dataset=tokens", f"data.path={pack}", "data.tokens.seq_len=16",
            "model.name=hpctrain:gpt_tiny", "model.kwargs.width=32", "model.kwargs.layers=1",
            "train.max_steps=3", "train.batch_size=4", "data.num_workers=0",
            "tensorboard=false", f"output_dir={tmp_path}", *extra]


def test_a_user_token_pack_trains(tmp_path, run_cli, packed):
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, packed, "run_name=mine"))
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "mine" / "summary.json").read_text())
    assert summary["steps"] == 3 and "val_answer_accuracy" not in summary["final_eval"]


def test_a_run_on_a_crafted_token_pack_is_exit_2_under_a_memory_limit(tmp_path, packed):
    """The whole run, in a process limited to 4 GiB of address space (had the check wrapped,
    it would allocate 2**32 tokens): one line naming the document, exit 2."""
    crafted = crafted_copy(packed, tmp_path, 2**64 - 2**32, 2**32 - 1)
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "run", "tiny-lm", *token_run(tmp_path, crafted)],
        capture_output=True, text=True, timeout=300, preexec_fn=AddressSpaceLimit(4 << 30))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "document 0" in done.stderr and "points outside its shard" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("override, words", [
    ("data.tokens.seq_len=200", ["data.tokens.seq_len=200", "context", "128"]),
    ("model.kwargs.vocab_size=100", ["vocabulary of 128", "ids up to 256"]),
    ("model.name=hpctrain:resnet_small", ["resnet_small", "tokens"]),
])
def test_a_model_that_cannot_take_the_tokens_is_refused(tmp_path, run_cli, packed, override,
                                                        words):
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, packed, override))
    assert code == 2, err[-2000:]
    assert all(word in err for word in words), err
    assert "Traceback" not in err


def damaged_copy(tmp_path, packed: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    return copy


def test_a_truncated_token_shard_is_named(tmp_path, run_cli, packed):
    copy = damaged_copy(tmp_path, packed)
    shard = copy / "train-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, copy))
    assert code == 2 and "train-00000.bin" in err and "truncated" in err


def test_batch_buffers_asked_for_documents_are_refused(tmp_path, run_cli, packed):
    """Documents are padded per batch (no fixed row to render into): data.loader=buffers is
    refused before training, in one line, exit 2."""
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, packed,
                                                        "data.tokens.batching=documents",
                                                        "data.loader=buffers"))
    assert code == 2 and "data.loader=buffers" in err and "use data.loader=auto" in err
    assert "Traceback" not in err and not list(tmp_path.rglob("summary.json"))


def test_an_id_outside_the_vocabulary_is_caught_before_the_model(tmp_path, run_cli, packed):
    copy = damaged_copy(tmp_path, packed)
    shard = copy / "train-00000.bin"
    ids = np.fromfile(shard, dtype="<u2")
    ids[::7] = 60000  # same size, so only reading the ids finds it
    ids.tofile(shard)
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, copy))
    assert code == 2 and "id 60000 is outside the vocabulary of 257" in err
    assert "train-00000.bin" in err


def test_an_image_pack_given_as_tokens_says_so(tmp_path, run_cli, packed):
    copy = damaged_copy(tmp_path, packed)
    manifest = json.loads((copy / "pack.json").read_text())
    (copy / "pack.json").write_text(json.dumps({**manifest, "format": "hpctrain-shards"}))
    code, _, err = run_cli("run", "tiny-lm", *token_run(tmp_path, copy))
    assert code == 2 and "data.dataset=shards" in err


def test_profile_of_a_language_model_gives_a_verdict_and_its_mfu(tmp_path, run_cli, lm_cache,
                                                                 monkeypatch):
    """The MFU divides by the peak `hpctrain bench node` measured on this node (a CPU has no
    spec sheet, so without the measurement there is none)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    profile = ["profile", "tiny-lm", *LM, f"data.arithmetic.cache_dir={lm_cache}",
               f"output_dir={tmp_path}", "train.batch_size=8", "--steps", "3"]
    code, out, err = run_cli(*profile, "--json")
    assert code == 0, err
    verdict = json.loads(out)["verdict"]
    assert verdict["bound"] == "compute-bound" and "CPU-only trace" in verdict["reason"]
    assert "mfu" not in verdict["numbers"]
    assert run_cli("bench", "node", "--size", "256", "--megabytes", "16", "--seconds",
                   "0.05")[0] == 0
    code, out, err = run_cli(*profile)
    assert code == 0, err
    assert re.search(r"MFU \d+\.\d% of the measured fp32 peak", out), out


def test_bench_data_measures_the_token_loader_against_the_model(run_cli, lm_cache):
    code, out, err = run_cli("bench", "data", "tiny-lm", *LM,
                             f"data.arithmetic.cache_dir={lm_cache}", "train.batch_size=8",
                             "--workers", "1", "--prefetch", "2", "--seconds", "0.5",
                             "--model", "--model-steps", "6", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["unit"] == "block" and report["decode_one_core"] is None
    assert report["best"]["samples_per_second"] > 0 and report["model_samples_per_second"] > 0


def test_a_held_out_share_that_leaves_nothing_to_train_on_is_refused(tmp_path, run_cli):
    code, _, err = run_cli("run", "tiny-lm", "data.arithmetic.max_operand=3",
                           "data.arithmetic.num_val=16", "data.arithmetic.operations=+",
                           f"data.arithmetic.cache_dir={tmp_path}", f"output_dir={tmp_path}")
    assert code == 2 and "data.arithmetic.num_val=16 leaves no problem for training" in err
    assert "Traceback" not in err


# ---- Hugging Face transformers causal LMs from a local config -------------------------------


HF_LM = [o for o in LM if not o.startswith("model.")]  # the data and training of LM


def test_a_transformers_causal_lm_trains_from_a_local_config(tmp_path, run_cli, lm_cache,
                                                             hf_config):
    code, out, err = run_cli("run", "tiny-lm", *HF_LM, f"data.arithmetic.cache_dir={lm_cache}",
                             f"output_dir={tmp_path}", "run_name=hf", "train.max_steps=60",
                             "train.log_every=10", "train.batch_size=16",
                             f"model.name=hf:{hf_config}", "model.kwargs.num_hidden_layers=2")
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "hf" / "summary.json").read_text())
    train = train_records(tmp_path / "hf")
    assert summary["task"] == "language_modeling" and summary["steps"] == 60
    assert train[-1]["loss"] < train[0]["loss"] - 1.0, [r["loss"] for r in train]
    assert "(0.12 M parameters)" in out + err  # two layers, as model.kwargs asked


@pytest.mark.parametrize("override, why", [
    ("model.kwargs.vocab_size=100", "has a vocabulary of 100 but the token data holds ids up "
                                    "to 256"),
    ("model.kwargs.max_position_embeddings=16", "is longer than the context of hf:"),
    ("model.kwargs.n_layers=2", "model.kwargs.n_layers: the llama config has no field"),
    ("model.name=hf:/nonexistent", "no config.json there"),
])
def test_a_transformers_model_that_cannot_take_the_data_is_refused(tmp_path, run_cli, lm_cache,
                                                                   hf_config, override, why):
    code, _, err = run_cli("run", "tiny-lm", *HF_LM, f"data.arithmetic.cache_dir={lm_cache}",
                           f"output_dir={tmp_path}", "train.max_steps=2",
                           f"model.name=hf:{hf_config}", override)
    assert code == 2 and why in err and "Traceback" not in err, err[-2000:]
