"""torch.compile in a run: the module the step calls and the mode it compiles in, where torch
keeps what it compiled, and what torch says it spent compiling.

A small model's step is launch-bound on a GPU (the default recipe's on an H200: 181 kernels of
a median 2 us, the card idle 95 % of the step): `compile_mode=auto` captures it in CUDA
graphs there, replayed with one launch, where its batches come in a few shapes (one graph
each) and one process trains it; torch's skips of them are counted and said.

A requeued job is a new process: by default torch keeps its compiled kernels in the node's
/tmp, which the next job, on another node or after the node's clean-up, does not find, so it
compiles again (the default recipe on a CPU reached its first step 54.9 s after a cold start,
9.9 s after a requeue with the folder kept: benchmarks/compile_restart.py). The run keeps
that folder in its output folder (`compile_cache: shared`, OUTPUT_DIR/.compile-cache/, where
the next run of the same model, a search's next trial, finds it too), with itself
(`compile_cache: run`, RUN_DIR/compile-cache/) or in a folder of your choosing, under a key of
the torch, Triton, Python and device that made it, so that a job on another card or version
never reads it. Torch's compiler takes file locks in that
folder; one that takes none (Lustre mounted without flock) is said and left for torch's own.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import itertools
import logging
import os
import platform
import re
import sys
from collections import deque
from contextlib import ExitStack
from pathlib import Path

import torch
from torch import nn

from hpctrain.config.recipe import CUDA_GRAPH_MODES
from hpctrain.data.kind import BOUNDED_SHAPES
from hpctrain.runs.directory import SHARED_COMPILE_CACHE, RunDir

CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"  # where torch's Inductor keeps its caches
# the folder the job's environment names, read before torch's compiler sets the variable
# itself (torch.compile does, to its default, where it is unset)
YOURS = os.environ.get(CACHE_VARIABLE)
# torch's own timings (torch._dynamo.utils.compilation_time_metrics): a graph's compilation
# (Dynamo, then the backend, the forward's kernels included), and the backward's, which
# AOTAutograd compiles at the first backward call
COMPILING = ("_compile.compile_inner", "backward._backward_impl")
TALLIED = ("compilation", "compiled_graphs", "recompiles", "compile_cache_hits",
           "compile_cache_misses", "cuda_graph_skips")
# recompilations a job is told of: the switch to evaluation and one shape made dynamic are two
# or three; past that the batches' shapes keep changing
RECOMPILES_TOLD = 4
FILES_COUNTED = 1000  # the banner counts a kept cache's files up to this (a shared one grows)


# `compile_mode=auto` captures CUDA graphs for models up to this size: their step's kernels
# are too short to hide their launches (the default recipe's 0.12 M parameters on an H200:
# 181 kernels a step, the GPU idle 95 % of it), where ResNet-50 (25.6 M) and GPT-124M keep the
# card busy (47 % MFU compiled without graphs). An assumption, said where it applies.
LAUNCH_BOUND_PARAMETERS = 10_000_000
SKIPPED = logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs")  # torch's reasons


def with_mode(plan, config, processes: int, parameters: int):
    """`plan` with the compile mode this run compiles with (compile on), and why where it is
    not the one asked: `auto` decided, CUDA graphs asked for on a CPU."""
    if not plan.compile:
        return plan
    asked, on_gpu = config.compile_mode, plan.device.startswith("cuda")
    if asked == "auto":
        mode, why = auto_mode(config, on_gpu, processes, parameters)
    elif asked in CUDA_GRAPH_MODES and not on_gpu:
        mode = "default" if asked == "reduce-overhead" else "max-autotune-no-cudagraphs"
        why = f"compile_mode {mode}: CUDA graphs ({asked}) need a GPU"
    else:
        mode, why = asked, ""
    return dataclasses.replace(plan, compile_mode=mode, compile_note=why)


def auto_mode(config, on_gpu: bool, processes: int, parameters: int) -> tuple[str, str]:
    """(mode, why) of compile_mode=auto: CUDA graphs where one GPU trains a small model on
    batches of a few shapes, as a whole step."""
    if not on_gpu:
        return "default", ""
    shapes = config.data.kind_spec.shapes(config.data)
    why_not = (f"its batches' shapes are {shapes}" if shapes not in BOUNDED_SHAPES else
               f"{processes} processes train it" if processes > 1 else
               "a model with its own steps compiles its forward alone"
               if config.task_spec.steps_model else
               f"{parameters / 1e6:.1f} M parameters keep the GPU busy"
               if parameters > LAUNCH_BOUND_PARAMETERS else None)
    if why_not:
        return "default", f"compile_mode default (auto; no CUDA graphs: {why_not})"
    return "reduce-overhead", (
        f"compile_mode reduce-overhead (auto): CUDA graphs replay each step with one launch, "
        f"as a {parameters / 1e6:.2f} M-parameter model's step is assumed launch-bound (under "
        f"{LAUNCH_BOUND_PARAMETERS / 1e6:.0f} M); compile_mode=default to run without")


def compiled(model: nn.Module, wrapped: nn.Module, config, plan) -> nn.Module:
    """The module the step calls, compiled when compile is on, in the plan's mode: a model
    with its own steps compiles its forward only (a LightningModule's steps, with their
    logging, stay Python, as under Lightning). Batches of a few known shapes compile a static
    graph each; others as torch chooses (static, then symbolic sizes once a shape changes)."""
    if not plan.compile:
        return wrapped
    if config.task_spec.steps_model:
        model.compile_forward(plan.compile_mode)
        return wrapped
    static = config.data.kind_spec.shapes(config.data) == "few"
    return replayed(torch.compile(wrapped, mode=plan.compile_mode,
                                  dynamic=False if static else None), plan.compile_mode)


def replayed(module: nn.Module, mode: str) -> nn.Module:
    """Under CUDA graphs, each call to `module` begins a new replay (a micro-batch's forward,
    an evaluation batch): its outputs are then the caller's until the next call, which
    torch's graph trees cannot tell apart from a second forward of one step by themselves.
    Torch's own skips are gathered (graph_skip_reasons)."""
    if mode in CUDA_GRAPH_MODES:
        module.register_forward_pre_hook(lambda *_: torch.compiler.cudagraph_mark_step_begin())
        if _SKIPS not in SKIPPED.handlers:
            SKIPPED.addHandler(_SKIPS)
    return module


class _SkipReasons(logging.Handler):
    """Why torch ran a compiled graph without CUDA graphs ("skipping cudagraphs due to
    mutated inputs"), as its logger says it, in order."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: deque[str] = deque(maxlen=20)  # the latest: a search's trials go on

    def emit(self, record: logging.LogRecord) -> None:
        self.reasons.append(record.getMessage().splitlines()[0][:300])


_SKIPS = _SkipReasons()


def graph_skip_reasons() -> list[str]:
    """Why torch ran graphs without CUDA graphs in this process, newest last."""
    return list(_SKIPS.reasons)


def graphs_skipped(skips: int, reasons: list[str]) -> str:
    """What a job whose CUDA graphs torch skipped is told: how many, the latest reason."""
    latest = reasons[-1] if reasons else "not said"
    return (f"hpctrain: warning: torch ran {skips} compiled graph(s) of this job without CUDA "
            f"graphs ({latest}): those parts of the step launch their kernels one by one. "
            "The reason names what to change in the model; compile_mode=default runs without "
            "trying them")


def keep_cache(setting: str, run_dir: Path, device: torch.device, held: ExitStack) -> str:
    """Point torch's compile caches at the folder `setting` names for this run (`shared`:
    in its output folder, `run`: in the run directory; `none`: torch's own; else a folder of
    your choosing), under this machine's key, until `held` closes; the banner's words for
    it."""
    if setting in ("shared", "run") and _yours():
        return (f"kept in {YOURS} (your {CACHE_VARIABLE}, which compile_cache={setting} "
                "leaves be)")
    if setting == "none":
        return ("kept where torch keeps them (the node's temporary folder, unless your "
                f"{CACHE_VARIABLE} says otherwise): a job on another node compiles again")
    base = RunDir(run_dir).compile_cache if setting == "run" else \
        Path(run_dir).parent / SHARED_COMPILE_CACHE if setting == "shared" else \
        Path(setting).expanduser()
    if setting == "shared" and (base.is_symlink() or (base / cache_key(device)).is_symlink()):
        return (f"kept where torch keeps them: {base} is a link, which hpctrain does not "
                "follow in an output folder; compile_cache=PATH names a folder of your choosing")
    folder = base.resolve() / cache_key(device)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _takes_locks(folder)
    except OSError as err:
        return (f"kept where torch keeps them: {folder} cannot hold them "
                f"({err.strerror or err}); a job on another node compiles again")
    found = sum(1 for _ in itertools.islice(_files(folder), FILES_COUNTED))
    _point_torch_at(str(folder), held)
    many = "+" if found == FILES_COUNTED else ""
    return f"kept in {folder}" + (f" ({found}{many} files from earlier jobs: loaded, not "
                                  "compiled again where they match)" if found else " (empty: "
                                  "compiled in this job, loaded by the next)")


def _yours() -> bool:
    """Whether the environment names a cache folder of the user's choosing: not torch's
    default, which a process that compiled before it (the job's parent) leaves set for its
    children."""
    if not YOURS:
        return False
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(YOURS) != os.path.abspath(default_cache_dir())


def cache_key(device: torch.device) -> str:
    """A folder name that differs wherever compiled kernels would: torch, Triton and Python
    versions, and the device (the GPU's name and capability; the CPU's vector instructions)."""
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "none"
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        made_for = f"{name} sm{''.join(map(str, torch.cuda.get_device_capability(index)))}"
    else:
        # the vector instructions Inductor's C++ kernels are compiled for (AVX2, AVX512...)
        name = platform.machine() or "cpu"
        made_for = f"{name} {torch.backends.cpu.get_cpu_capability()}"
    parts = [torch.__version__, triton, f"py{sys.version_info[0]}.{sys.version_info[1]}",
             made_for]
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"torch{torch.__version__}-{name}-{digest}")


def seconds_compiling() -> float:
    """Seconds this process has spent compiling so far, as torch counts them (none before
    torch's compiler is loaded)."""
    if "torch._dynamo.utils" not in sys.modules:
        return 0.0
    from torch._dynamo.utils import compilation_time_metrics

    return sum(sum(compilation_time_metrics.get(key, ())) for key in COMPILING)


def tally() -> dict:
    """What this process has compiled so far, as torch counts it: seconds, graphs, and the
    kernels its cache gave (hits) or had to compile (misses), forward and backward apart."""
    if "torch._dynamo.utils" not in sys.modules:
        return dict.fromkeys(TALLIED, 0.0)
    from torch._dynamo.utils import counters

    return {"compilation": seconds_compiling(),
            "compiled_graphs": counters["stats"]["unique_graphs"],
            "recompiles": recompiles(),
            "compile_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "compile_cache_misses": counters["inductor"]["fxgraph_cache_miss"],
            "cuda_graph_skips": counters["inductor"]["cudagraph_skips"]}


def recompiles() -> int:
    """Times torch compiled a function it had compiled before, in this process (each
    function's compilations after its first: a new shape, the switch to evaluation)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    counter = getattr(convert_frame, "FRAME_COMPILE_COUNTER", {})
    return sum(max(0, count - 1) for count in list(counter.values()))


def recompile_reasons() -> list[str]:
    """Why torch compiled a function again in this process: each of its compilations that
    a recompilation found wrong, its first line, newest last ("tensor 'ids' size mismatch at
    index 1. expected 8, actual 12")."""
    if "torch._dynamo.utils" not in sys.modules:
        return []
    failures = getattr(sys.modules["torch._dynamo.utils"], "guard_failures", {})
    return [re.sub(r"^\d+/\d+: ", "", str(reason).splitlines()[0] if str(reason) else "")
            for reasons in list(failures.values()) for reason in reasons]


def recompiling(recompiles: int, reasons: list[str]) -> str:
    """What a job that keeps compiling again is told: how often, the latest reason, the
    fix."""
    latest = reasons[-1][:200] if reasons else "not said"
    limit = getattr(torch._dynamo.config, "recompile_limit", None) or \
        getattr(torch._dynamo.config, "cache_size_limit", 8)
    return (f"hpctrain: warning: torch.compile compiled the model again {recompiles} times in "
            f"this job, the latest because {latest}. Each costs a compilation's seconds, and "
            f"past {limit} (torch._dynamo.config.recompile_limit) a function runs uncompiled. "
            "Give the batches few shapes: pad widths to a multiple (your collate; "
            "DataCollatorWithPadding(pad_to_multiple_of=64)) with data.bucketing=true, "
            "data.tokens.batching=blocks, or compile=false")


def _takes_locks(folder: Path) -> None:
    """Raise OSError where `folder`'s file system takes no flock (torch's compiler locks its
    cache with it)."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(handle, fcntl.LOCK_UN)
    except BlockingIOError:
        pass  # another job holds it: locks work
    finally:
        os.close(handle)


def _files(folder: Path):
    for _, _, names in os.walk(folder):
        yield from names


def _point_torch_at(folder: str, held: ExitStack) -> None:
    """torch's caches in `folder` until `held` closes (the run's end), then as they were: a
    next run in this process (a test, a search's trial) chooses its own."""
    before = os.environ.get(CACHE_VARIABLE)
    os.environ[CACHE_VARIABLE] = folder
    _forget_folders()

    def restore() -> None:
        if before is None:
            os.environ.pop(CACHE_VARIABLE, None)
        else:
            os.environ[CACHE_VARIABLE] = before
        _forget_folders()
    held.callback(restore)


def _forget_folders() -> None:
    """torch remembers folders derived from the cache's (its lock and kernel folders): cleared
    where this torch can, so the new one is read."""
    try:
        from torch._inductor.utils import clear_inductor_caches
    except ImportError:
        return
    clear_inductor_caches()
