"""Mixup and CutMix on the device batch: the tests that train, in this process or in an
`hpctrain` process of their own (the others are tests/unit/test_mixing.py)."""

import json




def test_a_run_trains_with_mixup_and_cutmix(run_cli, tiny, tmp_path):
    code, _, err = run_cli("run", "default", *tiny(
        "data.augment.mixup_alpha=0.2", "data.augment.cutmix_alpha=1.0",
        "train.label_smoothing=0.1", "run_name=mixed"))
    assert code == 0, err
    summary = json.loads((tmp_path / "runs" / "mixed" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_val_accuracy"] is not None
