"""train.fuse_eval: the tests that train, in this process or in an `hpctrain` process of their
own (the others are tests/unit/test_fused_eval.py)."""

import json

import torch



def _evaluations(tiny_config, *overrides):
    from hpctrain.train.bookkeeping import Clock
    from hpctrain.train.build import build_parts
    from hpctrain.train.loop import Progress, _run_steps
    from hpctrain.train.preemption import Stopper
    from hpctrain.train.telemetry import Telemetry

    parts = build_parts(tiny_config("train.max_steps=6", "train.eval_every_epochs=0.5",
                                    "precision=fp32", *overrides))
    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed))
    telemetry.close()
    lines = (parts.run_dir / "metrics.jsonl").read_text().splitlines()
    return parts, [r for r in map(json.loads, lines) if r["kind"] == "eval"]


def test_a_run_evaluates_the_same_with_and_without_folding(tiny_config):
    fused, with_folding = _evaluations(tiny_config, "train.fuse_eval=true")
    plain, without = _evaluations(tiny_config, "train.fuse_eval=false")
    assert fused.fused_eval is not None and plain.fused_eval is None
    assert len(with_folding) == len(without) >= 2  # each evaluation refolds the new weights
    for a, b in zip(with_folding, without):
        assert a["val_accuracy"] == b["val_accuracy"] and a["eval_seconds"] > 0
    images, _ = next(iter(fused.data.val_loader))
    inputs = fused.task.to_device((images, torch.zeros(len(images))), False).inputs
    with torch.no_grad():  # the trained weights and statistics, folded and not
        torch.testing.assert_close(fused.fused_eval.module().eval()(inputs),
                                   fused.model.eval()(inputs), rtol=1e-4, atol=1e-4)
    auto, _ = _evaluations(tiny_config)  # auto folds all 4 of the tiny CNN's pairs
    assert auto.fused_eval.describe() == "4 conv + batch-norm pairs folded for evaluation"
