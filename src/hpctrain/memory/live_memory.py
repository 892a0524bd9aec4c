"""Live memory of one training step, counted per storage as PyTorch allocates and frees it.

A TorchDispatchMode sees every tensor an operator creates; a weak-reference finaliser on each
new storage sees it freed. That works alike on real tensors and on FakeTensorMode's (no
memory behind them), so the same step is measured on a real CPU and predicted for any size.
torch has a tracker of this kind (torch.distributed._tools.mem_tracker), but private and
without the categories a user asks about; this one is small and ours.

A storage's category comes from when it was made: parameters and buffers before the step,
the batch, what the forward pass made and still holds (the activations autograd saved, the
inputs an activation checkpoint keeps), copies of the weights cast by autocast, what the
backward pass and the optimiser made (temporaries), then gradients and optimiser states,
re-labelled as they are attached.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CATEGORIES = ("parameters", "gradients", "optimizer states", "weight copies", "activations",
              "temporaries", "inputs")
PHASE_CATEGORY = {"forward": "activations", "backward": "temporaries",
                  "optimizer": "temporaries", "inputs": "inputs"}


class LiveMemory(TorchDispatchMode):
    """Bytes alive per category, their peak, and the split at the peak.

    `granularity` rounds each allocation up (the CUDA caching allocator hands out multiples of
    512 bytes); `limit` raises torch.OutOfMemoryError when the live total passes it, which is
    how a CPU run emulates a device of that size.
    """

    def __init__(self, granularity: int = 1, limit: int | None = None):
        super().__init__()
        self.granularity = granularity
        self.limit = limit
        self.storages: dict[int, list] = {}  # id(storage) -> [bytes, category]
        self.totals = dict.fromkeys(CATEGORIES, 0)
        self.live = 0
        self.phase_peaks: dict[str, dict[str, int]] = {}  # the split at each phase's peak
        self.phase = "forward"

    # ---- registering and re-labelling ----
    def add(self, tensor: torch.Tensor, category: str) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.storages:
            self.relabel(tensor, category)
            return
        size = math.ceil(storage.nbytes() / self.granularity) * self.granularity
        self.storages[key] = [size, category]
        weakref.finalize(storage, self._free, key)
        self.totals[category] += size
        self.live += size
        if self.live > sum(self.phase_peaks.get(self.phase, {}).values()):
            self.phase_peaks[self.phase] = dict(self.totals)
        if self.limit is not None and self.live > self.limit:
            raise torch.OutOfMemoryError(
                f"the step needs more than the {self.limit} bytes allowed (emulated device)")

    def relabel(self, tensor: torch.Tensor, category: str) -> None:
        entry = self.storages.get(id(tensor.untyped_storage()))
        if entry is not None and entry[1] != category:
            self.totals[entry[1]] -= entry[0]
            self.totals[category] += entry[0]
            entry[1] = category

    def category_of(self, tensor: torch.Tensor) -> str | None:
        entry = self.storages.get(id(tensor.untyped_storage()))
        return entry[1] if entry else None

    def _free(self, key: int) -> None:
        size, category = self.storages.pop(key)
        self.totals[category] -= size
        self.live -= size

    def track_model(self, model: nn.Module) -> None:
        """Parameters and buffers, and each gradient from the moment it is accumulated."""
        for tensor in [*model.parameters(), *model.buffers()]:
            self.add(tensor, "parameters")
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(
                    lambda p: self.add(p.grad, "gradients"))

    def track_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.numel() > 1:
                    self.add(value, "optimizer states")

    @property
    def at_peak(self) -> dict[str, int]:
        """The split when the live total was highest (the earliest phase on a tie)."""
        return max(self.phase_peaks.values(), key=lambda split: sum(split.values()),
                   default=dict(self.totals))

    @property
    def peak(self) -> int:
        return sum(self.at_peak.values())

    def reset_peak(self) -> None:
        """What is alive now is the new peak: it is recorded as the phase "step start"."""
        self.phase_peaks = {"step start": dict(self.totals)}

    # ---- every operator ----
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        category = PHASE_CATEGORY[self.phase]
        if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor) \
                and self.category_of(args[0]) == "parameters":
            category = "weight copies"  # autocast's cast of a weight, kept for the step
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and id(tensor.untyped_storage()) \
                    not in self.storages:
                self.add(tensor, category)
        return out
