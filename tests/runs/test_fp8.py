"""precision=fp8: the tests that train, in this process or in an `hpctrain` process of their
own (the others are tests/unit/test_fp8.py, tests/cluster/test_fp8.py)."""

import json

import pytest

from hpctrain.train.hardware import fp8

# 128 tokens a step and 32 held-out problems: a CPU whose oneDNN has no float8 kernel runs
# torch._scaled_mm as its reference loop (0.3 s for one 512x64x256 product on a Xeon with AMX),
# and the recipe's 2,048 tokens a step and 2,000 problems took this test 514 s there. No warmup:
# the short epoch's steps learn from the first (4.93 to 3.30 in 24 steps).
TINY_LM = ["model.kwargs.width=64", "train.max_steps=24", "train.log_every=8",
           "train.batch_size=4", "data.tokens.seq_len=32", "data.arithmetic.num_val=32",
           "schedule.warmup_epochs=0", "tensorboard=false", "report=false",
           "data.num_workers=0"]


@pytest.fixture
def fp8_without_the_hardware_check(monkeypatch):
    """The CPU passes as FP8 hardware: the float8 layers then train through the CPU's
    torch._scaled_mm, the code path a GPU takes with faster kernels."""
    monkeypatch.setattr(fp8, "check_available", lambda device: None)


def _train(config):
    from hpctrain.train.bookkeeping import Clock
    from hpctrain.train.build import build_parts
    from hpctrain.train.loop import Progress, _run_steps
    from hpctrain.train.preemption import Stopper
    from hpctrain.train.run_summary import banner
    from hpctrain.train.telemetry import Telemetry

    parts = build_parts(config)
    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed))
    telemetry.close()
    lines = (parts.run_dir / "metrics.jsonl").read_text().splitlines()
    losses = [r["loss"] for r in map(json.loads, lines) if r.get("kind") == "train"]
    return parts, losses, banner(parts, None)


def test_fp8_trains_like_bf16_and_keeps_the_checkpoint_keys(fp8_without_the_hardware_check,
                                                             tmp_path):
    from hpctrain.config import load_config
    from torchao.float8.float8_linear import Float8Linear

    runs = [f"output_dir={tmp_path}"]
    bf16, bf16_losses, _ = _train(load_config("tiny-lm", [*TINY_LM, *runs, "precision=bf16"]))
    parts, losses, banner = _train(load_config("tiny-lm", [*TINY_LM, *runs, "precision=fp8",
                                                           "fp8.layers=all"]))
    converted = [n for n, m in parts.model.named_modules() if isinstance(m, Float8Linear)]
    assert len(converted) == 12 and "head" not in converted  # 2 blocks x (4 + 2), not the head
    assert "fp8: 12 of 13 Linear layers in float8" in banner
    assert "are too small to gain from FP8" in banner  # 64-wide layers, converted on request
    assert losses[-1] < losses[0] - 0.5  # it learns
    assert losses[-1] == pytest.approx(bf16_losses[-1], rel=0.03)
    assert parts.model.state_dict().keys() == bf16.model.state_dict().keys()
