"""The attention kernel a CUDA GPU would run, for a prediction made without that GPU.

`F.scaled_dot_product_attention` picks its kernel at run time by asking the device. On fake
CUDA tensors, on a machine without a GPU, it asks in vain and runs math attention, which keeps
the b x heads x s x s attention weights for backward: `hpctrain memory gpt-1b` predicted 41 GiB
of activations per device where the GPU's fused kernel keeps 12. So while the simulation runs
its CUDA forward pass, `TargetAttention` makes the choice the target GPU would make and calls
that kernel's own operator, whose fake implementation allocates what the kernel keeps: the
output and one fp32 softmax statistic per query row, O(b x heads x s).

The choice follows torch's rules (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), the
parts that decide memory:
- flash attention on sm80 to sm121: fp16/bf16, head size at most 256, the same for q, k and v,
  no explicit mask, causal only with as many keys as queries (and on sm86/89/120 not training
  with a head size in (192, 224]). On Hopper and Blackwell (sm90, sm10x) a torch with cuDNN
  9.15 or newer takes cuDNN attention first where it applies (head size a multiple of 8, at
  most 128): it keeps the same (the output and one fp32 statistic per query row), and which
  one runs depends on the target's torch and cuDNN, not on the model, so the prediction runs
  flash and names both. cuDNN also takes an explicit mask (torch 2.11 on an H200 chose it for
  fp16, head size 64, a boolean mask); it then keeps what the efficient kernel keeps, the mask
  turned into a bias included, so the prediction runs that one and names both;
- memory-efficient attention on sm50 to sm121, also fp32 and with a mask: head size a multiple
  of 8 for fp16/bf16 (Tensor Cores), of 4 for fp32 on sm80 and later;
- math attention otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

HALF = (torch.float16, torch.bfloat16)


def choose(capability: tuple[int, int], dtype: torch.dtype, head_dim: int,
           value_dim: int, masked: bool, causal_square: bool, dropout: float,
           training: bool) -> str:
    """flash | efficient | math, as torch would choose on `capability` (flash standing for
    cuDNN attention too, which keeps the same)."""
    major, minor = capability
    same = head_dim == value_dim
    in_range = (8, 0) <= capability <= (12, 1)
    sm86_89_120 = (8, 6) <= capability <= (8, 9) or (12, 0) <= capability <= (12, 1)
    if in_range and dtype in HALF and same and head_dim <= 256 and not masked \
            and causal_square and not (training and sm86_89_120 and 192 < head_dim <= 224):
        return "flash"
    alignment = 8 if dtype in HALF else (4 if major >= 8 else 1)
    if (5, 0) <= capability <= (12, 1) and head_dim % alignment == 0 \
            and value_dim % alignment == 0:
        return "efficient"
    return "math"


class TargetAttention(TorchFunctionMode):
    """Within it, scaled_dot_product_attention on CUDA tensors runs the kernel the GPU of
    `capability` would; `chosen` says which, with what decided it."""

    def __init__(self, capability: tuple[int, int]):
        super().__init__()
        self.capability = capability
        self.chosen: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or args[0].device.type != "cuda":
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        call = {**dict(zip(names, args)), **kwargs}
        q, k, v = call["query"], call["key"], call["value"]
        mask, dropout = call.get("attn_mask"), call.get("dropout_p", 0.0)
        causal, scale = call.get("is_causal", False), call.get("scale")
        kernel = choose(self.capability, q.dtype, q.shape[-1], v.shape[-1], mask is not None,
                        q.shape[-2] == k.shape[-2], dropout, q.requires_grad)
        self.chosen.add(f"{kernel_name(self.capability, kernel, q.dtype, q.shape[-1])} "
                        f"(sm{self.capability[0]}{self.capability[1]}, "
                        f"{str(q.dtype).removeprefix('torch.')}, head size {q.shape[-1]}"
                        f"{', causal' if causal else ''}{', masked' if mask is not None else ''})")
        aten = torch.ops.aten
        if kernel == "flash":
            return aten._scaled_dot_product_flash_attention(
                q, k, v, dropout, causal, False, scale=scale)[0]
        if kernel == "efficient":
            if mask is not None and mask.dtype == torch.bool:  # as torch turns it into a bias
                mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill(~mask, -torch.inf)
            return aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, True, dropout, causal, scale=scale)[0]
        return func(*args, **kwargs)


def kernel_name(capability: tuple[int, int], kernel: str, dtype: torch.dtype,
                head_dim: int) -> str:
    """The kernel's name, with cuDNN attention where a Hopper or Blackwell GPU may take it
    instead for the same memory (the module's docstring says when)."""
    hopper = capability[0] in (9, 10)
    if hopper and kernel == "flash":
        return "flash or cuDNN"
    cudnn = hopper and kernel == "efficient" and dtype in HALF and head_dim % 8 == 0 \
        and head_dim <= 128
    return f"{kernel} or cuDNN" if cudnn else kernel
