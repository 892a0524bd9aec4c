"""`hpctrain autotune`: the tests that need no training run, no process and no server (the
others are tests/runs/test_autotune.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.config import load_config


def test_the_choices_on_this_cpu_keep_the_global_batch_what_you_fix_and_your_loader(
        tmp_path, tiny_config, run_cli, capsys):
    from hpctrain.autotune.knobs import space_of

    space = space_of(tiny_config("train.global_batch_size=64"), {})
    precision = space.knob("precision")
    assert [c.label for c in precision.choices] == ["fp32 (recipe)", "bf16"]
    assert precision.numerics and "fp16" in precision.note
    micro = space.knob("micro-batch")
    assert [c.label for c in micro.choices] == ["64 x 1 (recipe)", "32 x 2", "16 x 4", "8 x 8"]
    assert all(dict(c.settings)["train.global_batch_size"] == 64 for c in micro.choices[1:])
    fixed = space_of(tiny_config("precision=bf16"), {"precision": "bf16"})
    assert fixed.knob("precision") is None and "precision: kept as given" in fixed.notes[0]
    code, _, err = run_cli("autotune", "default", "--fix", "train.nonsense", "--dir",
                           str(tmp_path / "t"))
    assert code == 2 and "train.nonsense is no setting of the recipe" in err
    with pytest.raises(SystemExit) as refused:  # argparse's own one line
        run_cli("autotune", "default", "--budget", "ten")
    assert refused.value.code == 2
    assert "'ten' is not a duration: give 90s, 10m or 2h" in capsys.readouterr().err
    tests = Path(__file__).parent.parent
    yours = load_config(None, [f"model.name={tests / 'fixtures' / 'lit_classifier.py'}"
                               ":LitClassifier",
                               f"data.dataset={tests / 'fixtures' / 'lit_classifier.py'}"
                               ":blob_loaders"])
    kept = space_of(yours, {})
    assert kept.knob("workers") is None and kept.knob("micro-batch") is None
    assert "micro-batch: your DataLoader's batch size is kept" in kept.notes


def test_the_compile_knob_names_the_mode_auto_runs_and_does_not_try_it_twice(tiny_config):
    """compile_mode=auto is one of torch's modes once the model's size is known (counted on
    the meta device): a trial of that mode would repeat the recipe's own."""
    from hpctrain.autotune.knobs import _mode_run, space_of

    knob = space_of(tiny_config("compile=true"), {}).knob("compile")
    assert [c.label for c in knob.choices] == ["on, default (auto) (recipe)", "off"]
    # on a GPU: the default recipe's 0.12 M parameters take CUDA graphs, a GPT-124M does not
    assert _mode_run(load_config("default", []), True, 1)[0] == "reduce-overhead"
    assert _mode_run(load_config("default", []), True, 2)[0] == "default"
    assert _mode_run(load_config("tiny-lm", ["model.name=hpctrain:gpt_124m"]), True, 1)[0] == \
        "default"
    assert _mode_run(load_config("default", ["compile_mode=max-autotune"]), True, 1)[0] == \
        "max-autotune"


def test_a_model_the_meta_device_cannot_count_leaves_auto_s_mode_said_unknown(monkeypatch):
    from hpctrain.autotune.knobs import _mode_run
    from hpctrain.memory import estimate

    def refused(*args, **kwargs):
        raise ValueError("a shape that depends on the data")

    monkeypatch.setattr(estimate, "model_info", refused)
    assert _mode_run(load_config("default", []), True, 1) == (
        "auto", "compile_mode=auto's choice unknown (ValueError: a shape that depends on the "
        "data): every mode tried")
