"""Named regions of the training step, for `hpctrain profile` and for Nsight Systems.

Each region is a `record_function` range (it appears in torch.profiler's trace as a
user_annotation named `hpctrain/<region>`) and, on a CUDA machine, an NVTX range of the same
name, so Nsight Systems users see the step cut the same way. Outside a profiler the cost is a
few microseconds per region, a handful of times per step.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from hpctrain.profiling.names import PREFIX


@functools.cache
def _nvtx() -> bool:
    return torch.cuda.is_available()


@contextlib.contextmanager
def region(name: str):
    label = PREFIX + name
    with torch.profiler.record_function(label):
        if _nvtx():
            torch.cuda.nvtx.range_push(label)
        try:
            yield
        finally:
            if _nvtx():
                torch.cuda.nvtx.range_pop()
