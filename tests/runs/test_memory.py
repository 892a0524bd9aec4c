"""hpctrain memory: the tests that train, in this process or in an `hpctrain` process of their
own (the others are tests/unit/test_memory.py, tests/cluster/test_memory.py)."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.config import load_config
from hpctrain.memory.advice import advise
from hpctrain.memory.estimate import estimate, resolve_target, with_layout

MIB = 2**20


def test_find_batch_size_recovers_from_out_of_memory(run_cli, tiny, tmp_path):
    code, out, err = run_cli("memory", "default", *tiny("device=cpu"), "--gpu-memory",
                             "3MiB", "--find-batch-size", "--out", str(tmp_path), "--json")
    assert code == 0, err
    search = json.loads(out)["search"]
    trials = {t["batch_size"]: t for t in search["trials"]}
    assert any(not t["fits"] for t in trials.values())  # it met the limit and went on
    largest = search["largest"]
    assert trials[largest]["fits"] and trials[largest]["peak_bytes"] <= 3 * MIB
    assert all(t["images_per_second"] > 0 for t in trials.values() if t["fits"])
    assert search["recommended"] % 8 == 0
    assert search["recommended"] * search["grad_accum_steps"] >= 16


# ---- tensor and pipeline layouts ---------------------------------------------------------------

GPT_ON_GPU = ["model.name=hpctrain:gpt_mini", "data.tokens.seq_len=256", "train.batch_size=16",
              "optim.name=adamw", "precision=bf16"]


def test_the_largest_batch_named_fits_where_the_peak_changes_phase_with_the_batch():
    """With activation checkpointing the peak at small batches is the optimiser step's and at
    large ones the recomputed activations', a steeper line: the line through the batch and its
    half promised 236 on 1 GiB where 232 needs more (gpt-1b on an H200: 237, 157 GiB at 232).
    The batch named fits, and is within a tenth of the largest that does."""
    from hpctrain.memory.advice import advise

    config = load_config("tiny-lm", [*GPT_ON_GPU, "train.batch_size=8",
                                     "model.activation_checkpointing=true"])
    target = resolve_target(config, "1GiB")
    advice = advise(estimate(config, target), config)
    top, (option,) = advice.largest_batch, advice.options
    assert option.fits and option.settings == [f"train.batch_size={top // 8 * 8}"]
    assert not estimate(config, target, int(top * 1.1) + 1).fits


def test_advice_for_a_gpt_that_does_not_fit_names_a_layout_with_its_peak():
    config = load_config("tiny-lm", GPT_ON_GPU)
    base = estimate(config, resolve_target(config, "80GB"))
    context = base.target.context  # one device falls short; half the model fits
    capacity = int(context + (base.in_use - context) * 0.7)
    small = estimate(config, resolve_target(config, f"{capacity}B"))
    advice = advise(small, config)
    assert not small.fits and advice.decision == "activations"
    layouts = [o for o in advice.options if o.settings[0].startswith("parallel.")]
    assert layouts and all(o.fits and o.in_use < small.in_use for o in layouts)
    assert layouts[0].settings[-1] == "--gpus 2"  # the fewest devices that fit
    named = with_layout(small, config, 2, "none",
                        tensor=2 if "parallel.tensor=2" in layouts[0].settings else 1,
                        pipeline=2 if "parallel.pipeline=2" in layouts[0].settings else 1)
    assert layouts[0].in_use == named.in_use


def test_the_largest_batch_named_is_one_the_training_set_fills(tmp_path, run_cli):
    """Issue 67: a Hugging Face classifier on 300 reviews was told a batch of 44,920; the
    batch named now makes at least one whole step of the training set, and says so."""
    fixture = Path(__file__).parents[1] / "fixtures" / "hf_recipe.py"
    recipe = tmp_path / "text.yaml"
    recipe.write_text(f"name: text\ntask: classification\nmodel: {{name: '{fixture}:classifier'}}"
                      f"\ndata: {{dataset: '{fixture}:reviews', num_workers: 0}}\n")
    code, out, err = run_cli("memory", str(recipe), "--gpu-memory", "80GiB", "--json",
                             "--out", str(tmp_path))
    assert code == 0, err
    advice = json.loads(out)["advice"]
    assert advice["decision"] == "fits" and advice["largest_batch"] == 300
    option, = advice["options"]
    assert option["settings"] == ["train.batch_size=296"]
    assert "its 300 samples make one step of at most 300 per device" in option["effect"]
