"""Each system switch is resolved for the hardware and really takes effect in the loop: the
tests that need no training run, no process and no server (the others are
tests/runs/test_system.py)."""

import pytest
import torch

from hpctrain.config import load_config
from hpctrain.train.hardware.system import plan_system

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers")


@needs_no_gpu
def test_auto_switches_on_a_cpu_machine():
    plan = plan_system(load_config("default", ["channels_last=auto"]))  # the recipe's is on
    assert (plan.device, plan.precision, plan.channels_last, plan.compile,
            plan.cudnn_benchmark) == ("cpu", "fp32", False, False, False)


def test_fsdp_and_pipelines_keep_tensors_contiguous_and_say_why_channels_last_is_off():
    """fully_shard refuses a parameter laid out NHWC (a NotImplementedError on every rank),
    a pipeline stage's isend a feature map laid out so ("input tensor has to be contiguous"):
    under either channels_last is off, asked for or auto on a GPU, and the run's header says
    why; DDP keeps it."""
    config = load_config("default", ["channels_last=true"])
    sharded, staged = plan_system(config, sharded=True), plan_system(config, staged=True)
    whole = plan_system(config)
    assert (sharded.channels_last, staged.channels_last, whole.channels_last) == \
        (False, False, True)
    assert sharded.note == "channels_last off: FSDP shards only contiguous parameters"
    assert staged.note == "channels_last off: pipeline stages send only contiguous activations"
    assert whole.note == ""


@needs_no_gpu
@pytest.mark.parametrize("override, message", [
    ("device=cuda", "asked for a GPU, but this machine has none"),
    ("precision=fp16", "precision=fp16 needs a GPU"),
    ("precision=tf32", "Tensor Core mode"),
])
def test_gpu_only_requests_fail_clearly_on_cpu(run_cli, tiny, override, message):
    code, _, err = run_cli("run", "default", *tiny(override))
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("precision, tf32", [("fp32", False), ("tf32", True), ("bf16", True)])
def test_tf32_matmuls_follow_the_precision(precision, tf32):
    from hpctrain.train.hardware.system import SystemPlan, apply_global_switches

    plan = SystemPlan("cuda", "H100", precision, True, False, True, False)
    apply_global_switches(plan, seed=0)
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    assert torch.backends.cudnn.allow_tf32 is tf32
