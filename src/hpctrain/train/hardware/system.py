"""Resolve the `auto` system switches against the hardware, once, and apply the global ones.

Each switch is decided here and nowhere else: device, precision, channels_last, compile,
cudnn.benchmark, cuDNN's attention, determinism (compile's mode is decided with the model in
hand, train/compilation.py). The result is printed at the start of a run and saved in the
summary, so a user always knows what ran.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from hpctrain.config import Config
from hpctrain.data.kind import BOUNDED_SHAPES
from hpctrain.errors import DeviceError
from hpctrain.seeding import seed_process
from hpctrain.train.hardware import fp8


@dataclass(frozen=True)
class SystemPlan:
    device: str
    device_name: str
    precision: str  # fp32 | tf32 | fp16 | bf16 | fp8 (bf16 autocast around float8 Linears)
    channels_last: bool
    compile: bool
    cudnn_benchmark: bool
    deterministic: bool
    note: str = ""  # why a switch asked for is off, printed with the switches
    # torch.compile's mode (compile on): config.compile_mode, auto's decided where the model is
    # built (train/compilation.py: with_mode)
    compile_mode: str = ""
    compile_note: str = ""  # how auto decided it, or why it is not the mode asked
    # scaled_dot_product_attention may take cuDNN's kernels (a GPU run's only)
    cudnn_attention: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def resolve_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device={setting} asked for a GPU, but this machine has none that PyTorch can "
                f"use (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). "
                "Run on a GPU node (hpctrain submit), or use device=auto or device=cpu.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device={setting}: only {torch.cuda.device_count()} GPU(s) "
                              "visible (check CUDA_VISIBLE_DEVICES)")
    return device


def resolve_precision(setting: str, device: torch.device) -> str:
    if setting == "fp8":
        fp8.check_available(device)
        return setting
    if device.type == "cuda":
        if setting == "auto":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        if setting == "bf16" and not torch.cuda.is_bf16_supported():
            raise DeviceError(f"precision=bf16: {torch.cuda.get_device_name(device)} has no "
                              "bf16 support (needs Ampere or newer); use precision=fp16")
        return setting
    if setting == "auto":
        return "fp32"
    if setting == "fp16":
        raise DeviceError("precision=fp16 needs a GPU: fp16 autocast with loss scaling is a "
                          "CUDA feature and runs slower than fp32 on CPUs. Use precision=bf16 "
                          "(autocast works on CPU) or precision=fp32.")
    if setting == "tf32":
        raise DeviceError("precision=tf32 is a GPU Tensor Core mode (Ampere or newer); on the "
                          "CPU use precision=fp32 or precision=bf16")
    return setting


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


FSDP_KEEPS_LAYOUT = "channels_last off: FSDP shards only contiguous parameters"
PIPELINE_KEEPS_LAYOUT = "channels_last off: pipeline stages send only contiguous activations"


def plan_system(config: Config, device_setting: str | None = None, sharded: bool = False,
                staged: bool = False) -> SystemPlan:
    """Decide every `auto` switch for this machine (`device_setting`: this rank's device when
    the launcher decides it, else config.device; `sharded`: FSDP holds the parameters;
    `staged`: the model is cut into pipeline stages)."""
    device = resolve_device(device_setting or config.device)
    on_gpu = device.type == "cuda"
    precision = resolve_precision(config.precision, device)
    # channels_last lays out 4-D image tensors; token models have none
    channels_last = (on_gpu and config.data.kind_spec.channels_first) if config.channels_last == \
        "auto" else config.channels_last
    note = ""
    if channels_last and sharded:  # fully_shard refuses a conv weight laid out NHWC
        channels_last, note = False, FSDP_KEEPS_LAYOUT
    elif channels_last and staged:  # isend refuses an NHWC feature map between stages
        channels_last, note = False, PIPELINE_KEEPS_LAYOUT
    # compile pays for itself on GPUs (fused kernels, fewer launches); on CPU the compile time
    # dominates short runs, so auto leaves it off there.
    compile_ = (on_gpu and _has_triton()) if config.compile == "auto" else config.compile
    benchmark = (on_gpu and not config.deterministic) if config.cudnn_benchmark == "auto" \
        else config.cudnn_benchmark
    name = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    return SystemPlan(str(device), name, precision, channels_last, compile_, benchmark,
                      config.deterministic, note,
                      cudnn_attention=on_gpu and cudnn_attention(config))


def cudnn_attention(config: Config) -> bool:
    """Whether a GPU run lets scaled_dot_product_attention take cuDNN's kernels: cuDNN builds
    an execution plan for each sequence length it meets (tens of milliseconds each, hundreds
    with a mask: a run whose batches each have a width of their own crawled at 1-2 % GPU
    utilisation on an H200), so `auto` leaves them to batches of a bounded few shapes; your
    own data's shapes are your collate's, unknown here."""
    if config.cudnn_attention != "auto":
        return config.cudnn_attention
    return config.data.kind_spec.shapes(config.data) in BOUNDED_SHAPES


def apply_global_switches(plan: SystemPlan, seed: int) -> None:
    """The process-wide flags: TF32, cudnn autotuning, determinism, the seeds (random, NumPy
    and torch: seeding.py)."""
    tf32 = plan.precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = plan.cudnn_benchmark
    if plan.device.startswith("cuda"):
        torch.backends.cuda.enable_cudnn_sdp(plan.cudnn_attention)
    if plan.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    seed_process(seed)
    if plan.device == "cpu":
        keep_freed_host_memory()


HOST_MMAP_THRESHOLD = 1 << 30  # blocks up to 1 GiB are reused from the heap
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def keep_freed_host_memory() -> bool:
    """Training on the CPU: let glibc keep freed blocks for the next step.

    glibc hands a freed block above its mmap threshold (dynamic, at most 32 MiB) back to the
    kernel, so every step's large activations come back as fresh pages that the kernel must
    fault in and zero: PointNet on two cores spent as much time in the kernel as in its own
    code, and ran at half its speed (docs/benchmarks.md). A threshold of 1 GiB (and no
    trimming below it) keeps them in the heap; the resident memory then stays at the step's
    peak, which a training process reaches every step anyway. Returns whether it applied
    (not on a C library without mallopt, nor where it refuses the value)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, HOST_MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, HOST_MMAP_THRESHOLD))
