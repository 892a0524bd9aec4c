"""A model about to be built in host memory is counted on the meta device first (no memory,
milliseconds): one whose parameters alone exceed the memory available here is refused,
naming its size (exit 3), where building it would fail an allocation of terabytes with a
traceback, or, on a kernel that overcommits, wake the OOM killer. `hpctrain memory` builds on
the meta device and is not asked; it says what fits a GPU."""

from __future__ import annotations

import torch
from torch import nn

from hpctrain.errors import DoesNotFit
from hpctrain.monitor.host_memory import room


def building_for_real() -> bool:
    """Whether a model built now lands in host memory (not on the meta device)."""
    return torch.get_default_device().type == "cpu"


def refuse_if_too_large(what: str, on_meta: nn.Module, copies: int = 1,
                        held: str = "as built") -> None:
    """DoesNotFit when `copies` of the parameters of `on_meta` (the model built on the meta
    device: `held` says what the copies are) take more than this process may still be given
    (monitor/host_memory.room: the host's free memory, the job's cgroup, the address space)."""
    parameters = sum(p.numel() for p in on_meta.parameters())
    needed = copies * sum(p.numel() * p.element_size() for p in on_meta.parameters())
    left = room()
    if left is not None and needed > left.bytes:
        raise DoesNotFit(f"{what}: {parameters:,} parameters, {needed / 2**30:,.1f} GiB {held} "
                         f"({torch.get_default_dtype()}), more than the "
                         f"{left.bytes / 2**30:,.1f} GiB of {left.bound}; give it "
                         "fewer layers, a smaller width or vocabulary (model.kwargs)")
