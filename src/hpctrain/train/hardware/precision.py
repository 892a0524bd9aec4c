"""Mixed precision: the autocast context and, for fp16, dynamic loss scaling.

bf16 has fp32's exponent range and needs no scaling; fp16 does, so its gradients go through a
GradScaler that skips steps with inf/NaN gradients and adapts the scale. tf32 is plain fp32
code with Tensor Core matmuls, switched on globally in system.py. fp8 is bf16 autocast around
the float8 Linear layers of train/hardware/fp8.py, whose casts and scales are their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


class Precision:
    def __init__(self, name: str, device: torch.device,
                 clip: Callable = torch.nn.utils.clip_grad_norm_,
                 after_step: Callable[[], None] | None = None):
        """`clip(parameters, max_norm)`: torch's, or grad_norm.clip_ when one model copy spans
        several processes. `after_step()`: work on the new weights (fp8.after_step)."""
        self.name = name
        self.clip = clip
        self.after_step = after_step
        self.device_type = device.type
        self.dtype = AUTOCAST_DTYPES.get(name)
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, parameters, clip_norm: float | None,
             before_step: Callable[[], None] | None = None):
        """Unscale (fp16), `before_step()` (a LightningModule's on_before_optimizer_step: it
        sees the gradients unscaled and not yet clipped, as under Lightning), clip if asked,
        and step; a scaler skips non-finite steps."""
        if self.scaler:
            if clip_norm or before_step:
                self.scaler.unscale_(optimizer)
            if before_step:
                before_step()
            if clip_norm:
                self.clip(parameters, clip_norm)
            self.scaler.step(optimizer)
            self.scaler.update()
            return
        if before_step:
            before_step()
        if clip_norm:
            self.clip(parameters, clip_norm)
        optimizer.step()
        if self.after_step:
            self.after_step()

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler and state:
            self.scaler.load_state_dict(state)
