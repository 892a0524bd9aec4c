"""The data dimension's wrappers: DDP around the model, or FSDP2 sharding it in place (on the
mesh's replicate x shard dimensions under tensor or pipeline parallelism), SyncBatchNorm, and
the gradient reduction that an accumulation defers to its last micro-step."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from hpctrain.config import Config, Strategy
from hpctrain.models.checkpointing import is_block
from hpctrain.parallel.layout import FSDP_DIMENSIONS
from hpctrain.parallel.processes import Distributed


def wrap_model(model: nn.Module, distributed: Distributed, config: Config,
               device: torch.device, precision: str) -> nn.Module:
    """The module the training step calls: DDP around `model`, or `model` sharded in place."""
    p = config.parallel
    if distributed.strategy == Strategy.DDP and distributed.mesh is None:
        return nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=p.bucket_cap_mb, gradient_as_bucket_view=p.gradient_as_bucket_view,
            static_graph=p.static_graph)
    if distributed.strategy in (Strategy.DDP, Strategy.FSDP):  # DDP on a mesh: FSDP2 replicating
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if bf16_parameters(model, precision) else MixedPrecisionPolicy()
        options = dict(mp_policy=mixed, reshard_after_forward=p.reshard_after_forward,
                       offload_policy=CPUOffloadPolicy() if p.cpu_offload else OffloadPolicy())
        if distributed.mesh is not None:
            options["mesh"] = distributed.mesh[FSDP_DIMENSIONS]
        for block in [m for m in model.modules() if is_block(m)]:
            fully_shard(block, **options)
        fully_shard(model, **options)
    return model


def bf16_parameters(model: nn.Module, precision: str) -> bool:
    """FSDP gathers bf16 copies of the parameters (half the traffic) when the run is bf16 or
    fp8 (whose float8 layers gather their own way) and no BatchNorm needs its fp32 statistics
    to match its weights' dtype; otherwise it gathers fp32 and autocast still computes in
    bf16."""
    return precision in ("bf16", "fp8") and not any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def convert_batchnorm(model: nn.Module, config: Config, strategy: Strategy) -> nn.Module:
    if strategy == Strategy.DDP and config.parallel.sync_batchnorm:
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def gradient_sync(module: nn.Module):
    """A function `sync(enabled)` giving the context for one micro-step: gradients are
    reduced only on the last micro-step of an accumulation (DDP no_sync, FSDP2
    set_requires_gradient_sync)."""
    inner = getattr(module, "_orig_mod", module)  # under torch.compile
    if isinstance(inner, nn.parallel.DistributedDataParallel):
        return lambda enabled: contextlib.nullcontext() if enabled else inner.no_sync()
    if hasattr(inner, "set_requires_gradient_sync"):
        def fsdp_sync(enabled: bool):
            inner.set_requires_gradient_sync(enabled)
            return contextlib.nullcontext()
        return fsdp_sync
    return lambda enabled: contextlib.nullcontext()
