"""Each system switch is resolved for the hardware and really takes effect in the loop.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_system.py."""

import torch

from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.worker_signals import SignalSafeLoader
from hpctrain.tasks.steps import Batch
from hpctrain.train.bookkeeping import Clock
from hpctrain.train.build import build_parts
from hpctrain.train.loop import Progress, _run_steps
from hpctrain.train.preemption import Stopper
from hpctrain.train.telemetry import Telemetry


def _observe_steps(parts):
    """Run the real loop; record what the model saw in its forward passes."""
    seen = []

    def hook(module, inputs, output):
        if module.training:
            seen.append((inputs[0], output.dtype, torch.is_autocast_enabled("cpu")))
    first_conv = next(m for m in parts.model.modules() if isinstance(m, torch.nn.Conv2d))
    first_conv.register_forward_hook(hook)
    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed))
    telemetry.close()
    return seen


def test_bf16_runs_the_model_under_autocast(tiny_config):
    parts = build_parts(tiny_config("precision=bf16", "train.max_steps=2"))
    seen = _observe_steps(parts)
    assert seen and all(dtype == torch.bfloat16 and autocast for _, dtype, autocast in seen)
    assert all(p.dtype == torch.float32 for p in parts.model.parameters())  # master weights


def test_fp32_runs_without_autocast(tiny_config):
    seen = _observe_steps(build_parts(tiny_config("precision=fp32", "train.max_steps=2")))
    assert seen and all(dtype == torch.float32 and not ac for _, dtype, ac in seen)


def test_channels_last_changes_weights_and_inputs(tiny_config):
    parts = build_parts(tiny_config("channels_last=true", "train.max_steps=2"))
    conv = next(m for m in parts.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()
    seen = _observe_steps(parts)
    assert all(x.is_contiguous(memory_format=torch.channels_last) for x, _, _ in seen)
    plain = build_parts(tiny_config("channels_last=false"))
    conv = next(m for m in plain.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous()


def test_compile_wraps_the_forward_and_cudnn_flags_apply(tiny_config):
    parts = build_parts(tiny_config("compile=true", "cudnn_benchmark=true"))
    assert isinstance(parts.step.model, torch._dynamo.eval_frame.OptimizedModule)
    assert parts.step.model._orig_mod is parts.model
    assert torch.backends.cudnn.benchmark is True
    parts = build_parts(tiny_config("compile=false", "deterministic=true"))
    assert parts.step.model is parts.model
    assert torch.are_deterministic_algorithms_enabled()


def test_training_switches_reach_their_one_place(tiny_config):
    parts = build_parts(tiny_config("train.label_smoothing=0.2", "optim.nesterov=true",
                                    "data.num_workers=1", "data.prefetch_factor=3"))
    logits = torch.tensor([[4.0, 0.0, 0.0]])
    batch = Batch(logits, torch.tensor([0]), torch.tensor([0]))
    smoothed = -(0.2 / 3 * torch.log_softmax(logits, 1)).sum() - 0.8 * torch.log_softmax(
        logits, 1)[0, 0]
    assert torch.allclose(parts.task.loss(logits, batch), smoothed)
    assert parts.step.optimizer.param_groups[0]["nesterov"] is True
    loader = parts.data.train_loader
    assert isinstance(loader, BufferedLoader)  # an image folder decoded on the CPU
    assert loader.num_workers == 1 and loader.persistent_workers and loader.prefetch_factor == 3
    assert loader.drop_last and not parts.data.val_loader.drop_last
    # its buffers are small: kept between evaluations, with its workers (test_data.py)
    assert parts.data.val_loader.persistent_workers
    assert not loader.pin_memory  # pinned memory only helps copies to a GPU
    torch_loader = build_parts(tiny_config("data.loader=torch")).data.train_loader
    assert isinstance(torch_loader, SignalSafeLoader)


FAULTS_PER_STEP = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from hpctrain.train.hardware.system import keep_freed_host_memory
    assert keep_freed_host_memory()
def step():  # a 64 MiB activation made and freed, as every training step does
    torch.ones(16 * 1024 * 1024).sum()
for _ in range(10):  # the heap settles in the first few steps
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def test_cpu_training_keeps_freed_blocks_instead_of_faulting_fresh_pages():
    import subprocess
    import sys

    faults = {mode: float(subprocess.run([sys.executable, "-c", FAULTS_PER_STEP, mode],
                                         capture_output=True, text=True, check=True).stdout)
              for mode in ("default", "keep")}
    pages = 64 * 1024 * 1024 // 4096
    assert faults["default"] > pages / 2  # glibc returns the block: every page faults again
    assert faults["keep"] < pages / 100, faults
