"""The norm of a model's gradients (or weights) when one model copy spans several processes.

Under tensor parallelism the parameters are a mix: DTensors split over the tensor group (and,
with FSDP, over the data group too), DTensors replicated, and plain tensors that every rank of
the group holds whole. torch's `clip_grad_norm_` refuses such a mix, and over pipeline stages
each rank holds other layers altogether. So each rank sums the squares of what it holds,
weighted by how many ranks of its pipeline stage hold the same values, and one all-reduce over
all ranks adds them up: every value counted exactly once.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def total_norm(tensors: list[torch.Tensor], ranks_per_stage: int) -> torch.Tensor:
    """The 2-norm of `tensors` (this rank's pieces) over the whole model, on every rank.
    Collective: every rank calls it."""
    groups: dict[float, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(_share(tensor, ranks_per_stage), []).append(_local(tensor))
    device = next((t.device for g in groups.values() for t in g), torch.device("cpu"))
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for share, pieces in groups.items():
        norms = torch._foreach_norm([p.float() for p in pieces])
        squares += torch.stack(norms).pow(2).sum() * share
    dist.all_reduce(squares)
    return squares.sqrt()


def clip_(parameters: list[torch.nn.Parameter], max_norm: float, ranks_per_stage: int,
          copies: tuple = ()) -> torch.Tensor:
    """Scale the gradients so that their total norm is at most `max_norm` (as torch's
    clip_grad_norm_ does); returns the norm before clipping. `copies`: parameters that
    duplicate one held elsewhere (a pipeline's second copy of a tied weight), scaled but not
    counted twice."""
    settle_gradients(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    skip = {id(p) for p in copies}
    norm = total_norm([p.grad for p in parameters if p.grad is not None and id(p) not in skip],
                      ranks_per_stage)
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    if grads:
        torch._foreach_mul_([_local(g) for g in grads], scale)
    return norm


def settle_gradients(parameters) -> None:
    """Give each DTensor gradient its parameter's layout. Autograd may leave one otherwise (a
    vocabulary-split embedding's gradient comes back whole, as partial sums), which the
    optimiser would redistribute anyway; here the norm and the pieces must match the weights."""
    for p in parameters:
        if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
            p.grad = p.grad.redistribute(p.device_mesh, p.placements)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _share(tensor: torch.Tensor, ranks_per_stage: int) -> float:
    """1 / how many ranks of the stage hold this rank's values of `tensor`."""
    if not isinstance(tensor, DTensor):
        return 1 / ranks_per_stage  # replicated on every rank of the stage
    # counted by what is replicated: FSDP's split of a tensor-parallel shard is no Shard
    mesh_sizes = tensor.device_mesh.mesh.shape
    copies = math.prod(size for size, placement in zip(mesh_sizes, tensor.placements)
                       if placement.is_replicate())
    return math.prod(mesh_sizes) / copies / ranks_per_stage
