"""The process group (and the DeviceMesh of a model-parallel run), and the few collectives the
loop needs. The model's distributed forms are data.py (DDP, FSDP2), tensor.py and pipeline.py.

Everything is decided once, at build, from the config and the process environment (layout.py).
The layout is checked before the process group starts, because a wrong layout (more ranks than
GPUs, a global batch that does not divide) otherwise shows up as a hang in the first collective.

Besides the training group (NCCL on GPUs, gloo on CPU) a small gloo group carries the
CPU-side agreements: the per-step stop flag and the timings gathered at logging intervals.
On GPUs these then never wait on the CUDA stream. Checkpoints get a gloo group of their own:
an asynchronous save runs its collectives from a background thread, and two threads must
never issue collectives on one group (the ranks could pair them up differently and hang).
"""

from __future__ import annotations

import contextlib
import os
import statistics
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.cluster.records import ProcessEnv
from hpctrain.config import Config, Strategy
from hpctrain.data.loader import usable_cpus
from hpctrain.errors import ConfigError, DeviceError, RunFailed
from hpctrain.parallel import grad_norm
from hpctrain.parallel.layout import MESH_DIMENSIONS, Layout


@dataclass
class Distributed:
    env: ProcessEnv
    layout: Layout
    control: object | None = None  # the gloo group for CPU-side agreements
    checkpoints: object | None = None  # the gloo group for checkpoint collectives
    hosts: tuple[str, ...] = ()
    # (pipeline, replicate, shard, tensor) when one model copy spans several processes; the
    # data dimension is `replicate` under ddp and `shard` under fsdp, the other one is 1
    mesh: object | None = None

    @property
    def strategy(self) -> Strategy:  # how the data dimension holds the model
        return self.layout.strategy

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @property
    def active(self) -> bool:
        return self.env.world_size > 1

    @property
    def data_rank(self) -> int:
        """Which share of each batch this rank trains on (the layout's answer)."""
        return self.layout.data_index(self.rank)

    @property
    def reports(self) -> bool:
        """Whether this rank's figures count, one rank per data share (the layout's answer)."""
        return self.layout.reports(self.rank)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` (figures of this rank's data) over ranks in place, each data share
        counted once (on its device, in the training group)."""
        if self.active:
            if not self.reports:
                tensor.zero_()
            dist.all_reduce(tensor)
        return tensor

    def clip_function(self, copies: tuple = ()):
        """How to clip gradients: torch's clip_grad_norm_, or a norm over the pieces of a
        model copy spread over several processes (`copies`: see grad_norm.clip_)."""
        if not self.layout.model_parallel:
            return torch.nn.utils.clip_grad_norm_
        per_stage = self.layout.ranks_per_stage
        return lambda parameters, max_norm: grad_norm.clip_(list(parameters), max_norm,
                                                            per_stage, copies)

    def weights_norm(self, model: nn.Module) -> torch.Tensor:
        """The norm of all the model's weights, the same on every rank (collective under
        sharding)."""
        params = [p.detach() for p in model.parameters()]
        if self.layout.model_parallel:
            return grad_norm.total_norm(params, self.layout.ranks_per_stage)
        norm = torch.nn.utils.get_total_norm(params)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def any(self, flag: int) -> int:
        """The largest of the ranks' small integer flags (0 = nothing to report)."""
        if not self.active:
            return flag
        value = torch.tensor([flag], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.control)
        return int(value.item())

    def gather(self, values: list[float]) -> list[list[float]]:
        """Every rank's `values`, in rank order (CPU side, gloo)."""
        if not self.active:
            return [values]
        mine = torch.tensor(values, dtype=torch.float64)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine, group=self.control)
        return [t.tolist() for t in out]

    def gather_objects(self, obj) -> list:
        """Every rank's picklable `obj`, in rank order (CPU side, gloo)."""
        if not self.active:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def align_buffers(self, model: nn.Module) -> None:
        """DDP: give every rank rank 0's buffers (BatchNorm statistics), as DDP itself does at
        the next forward. Between steps they differ per rank, and a checkpoint keeps one
        copy of what it takes to be replicated: it must be the copy training goes on with."""
        if self.active and self.strategy == Strategy.DDP:
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)

    def same_weights(self, model: nn.Module) -> None:
        """FSDP: rank 0's parameters and buffers on every rank before sharding (DDP does it
        itself). A user's model or factory may draw its initial weights without a common
        seed; each rank would then keep a shard of a different initialisation."""
        if self.active and self.strategy == Strategy.FSDP:
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        if self.active:
            dist.barrier(group=self.control)

    @contextlib.contextmanager
    def node_leader_first(self):
        """Let local rank 0 of each node go first (e.g. to build a dataset cache), then the
        others, so that they find it made instead of all making it at once."""
        if self.env.local_rank == 0:
            try:
                yield
            finally:  # also on failure: the others then meet the same error themselves
                self.barrier()
        else:
            self.barrier()
            yield


def local_device(setting: str, env: ProcessEnv) -> str:
    """This rank's device: cuda:LOCAL_RANK when the node's GPUs are all visible, cuda:0 when
    the scheduler's launcher gave each task its own GPU (one GPU per task)."""
    if setting == "cpu" or env.world_size == 1 or not torch.cuda.is_available():
        return setting
    visible = torch.cuda.device_count()
    if visible >= env.local_world_size:
        return f"cuda:{env.local_rank}"
    if visible == 1 and env.by_scheduler:
        return "cuda:0"
    raise DeviceError(
        f"{env.local_world_size} processes on {env.hostname} but only {visible} GPU(s) "
        "visible: start one process per GPU (torchrun --nproc-per-node="
        f"{visible}, or {visible} tasks per node of the scheduler's launcher), or make more "
        "GPUs visible "
        "(CUDA_VISIBLE_DEVICES, --gpus-per-node)")


def per_device_batch(config: Config, data_size: int) -> tuple[int, int]:
    """(per-device micro-batch, global batch) for this many shares of the data (processes,
    unless tensor or pipeline parallelism groups them)."""
    train = config.train
    per_step = data_size * train.grad_accum_steps
    if train.global_batch_size is None:
        return train.batch_size, train.batch_size * per_step
    if train.global_batch_size % per_step:
        low = max(per_step, train.global_batch_size // per_step * per_step)
        raise ConfigError(
            f"train.global_batch_size={train.global_batch_size} does not divide among "
            f"{data_size} process(es) of the data dimension x {train.grad_accum_steps} "
            f"accumulation step(s); use a multiple of {per_step} (e.g. {low} or "
            f"{low + per_step}) or change train.grad_accum_steps")
    return train.global_batch_size // per_step, train.global_batch_size


def check_layout(config: Config, layout: Layout, device: torch.device, precision: str) -> None:
    """Refuse what cannot work, before any process group exists."""
    p, strategy = config.parallel, layout.strategy
    if p.backend == "nccl" and device.type != "cuda":
        raise ConfigError("parallel.backend=nccl needs GPUs; on CPU use gloo (or auto)")
    if p.static_graph and strategy == Strategy.DDP and config.train.grad_accum_steps > 1:
        raise ConfigError("parallel.static_graph=true cannot be combined with "
                          "train.grad_accum_steps>1 (DDP's static graph does not support "
                          "skipping the gradient reduction on accumulation micro-steps); "
                          "set one of them back")
    if p.sync_batchnorm and strategy == Strategy.DDP and device.type != "cuda":
        raise ConfigError("parallel.sync_batchnorm=true needs GPUs (torch's SyncBatchNorm "
                          "runs on CUDA only); set it to false on CPU")
    if config.train.fuse_eval is True and (strategy == Strategy.FSDP or layout.model_parallel):
        raise ConfigError("train.fuse_eval=true folds batch-norms into whole convolutions; "
                          "with FSDP, tensor or pipeline parallelism each process holds only "
                          "part of them: set train.fuse_eval=auto (off there) or false")
    if strategy == Strategy.FSDP:
        if p.cpu_offload and device.type != "cuda":
            raise ConfigError("parallel.cpu_offload=true moves FSDP shards from GPU to host "
                              "memory; on CPU there is nothing to offload: set it to false")
        if precision == "fp16":
            raise ConfigError("parallel.strategy=fsdp with precision=fp16 is not supported: "
                              "use precision=bf16 (no loss scaling needed)")
        if config.optim.ema.enabled:
            raise ConfigError("optim.ema.enabled=true is not supported with "
                              "parallel.strategy=fsdp yet; use ddp, or switch EMA off")
        if p.sync_batchnorm:
            raise ConfigError("parallel.sync_batchnorm=true applies to ddp only; set it to "
                              "false with parallel.strategy=fsdp")
    if layout.model_parallel:
        named = f"parallel.tensor={layout.tensor}" if layout.pipeline == 1 else \
            f"parallel.pipeline={layout.pipeline}"
        if layout.pipeline > 1 and p.schedule == "zero-bubble" and layout.data > 1:
            raise ConfigError(f"parallel.schedule=zero-bubble with parallel.data={layout.data} "
                              "is not supported yet (its weight gradients, computed apart, "
                              "miss FSDP's reduction and the ranks wait on each other); use "
                              "parallel.schedule=interleaved-1f1b, or zero-bubble with "
                              "parallel.data=1")
        if layout.pipeline > 1 and config.train.grad_accum_steps > 1:
            raise ConfigError(f"{named}: the pipeline's micro-batches are the accumulation; "
                              "set train.grad_accum_steps=1 and raise parallel.microbatches")
        if precision == "fp16":
            raise ConfigError(f"{named} with precision=fp16 is not supported: use "
                              "precision=bf16 (no loss scaling needed)")
        if precision == "fp8" and layout.tensor > 1:
            raise ConfigError(f"parallel.tensor={layout.tensor} with precision=fp8 is not "
                              "supported yet (the split layers would need float8 "
                              "tensor-parallel styles); use precision=bf16 with tensor "
                              "parallelism, or fp8 with DDP, FSDP or a pipeline")
        if config.optim.ema.enabled:
            raise ConfigError(f"optim.ema.enabled=true is not supported with {named} yet; "
                              "switch EMA off")
        if p.sync_batchnorm:
            raise ConfigError(f"parallel.sync_batchnorm=true applies to data parallelism "
                              f"alone; set it to false with {named}")
        if config.optim.name in ("lars", "lamb"):
            raise ConfigError(f"optim.name={config.optim.name} scales each layer's step by "
                              f"its whole norm, which {named} splits; use adamw or sgd")


_OWN: list = []  # the process groups hpctrain started in this process (None: the default)


def _adopt(env: ProcessEnv, backend: str) -> None:
    """Train in the default process group the script started before fit (Hugging Face's
    TrainingArguments starts one under torchrun), where it is the launcher's and its backend
    the device's; a ConfigError names what differs."""
    theirs = (dist.get_world_size(), dist.get_rank(), dist.get_backend())
    if theirs[:2] != (env.world_size, env.rank) or backend not in theirs[2]:
        raise ConfigError(f"your script started a process group of {theirs[0]} processes "
                          f"(rank {theirs[1]}, backend {theirs[2]}) before hpctrain, where "
                          f"the launcher says {env.world_size} (rank {env.rank}) and the "
                          f"device takes {backend}: let hpctrain start it (leave out "
                          "init_process_group)")


def leave() -> None:
    """End the process groups hpctrain started (the default one where it started it; one
    your script started is left to it)."""
    groups = _OWN[::-1]  # the default group, where it is hpctrain's, last
    _OWN.clear()
    for group in groups:
        if dist.is_initialized():
            dist.destroy_process_group(group)


def start(config: Config, env: ProcessEnv, layout: Layout, device: torch.device) -> Distributed:
    """Join the process group (nothing to do for one process), and lay the ranks out on a
    DeviceMesh when one model copy spans several of them."""
    if env.world_size == 1:
        return Distributed(env, layout, hosts=(env.hostname,))
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # a scheduler's launcher sets no thread count: without this each process would use
        # every core
        torch.set_num_threads(max(1, usable_cpus() // env.local_world_size))
    backend = config.parallel.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=config.parallel.timeout_seconds)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # torchrun's workers find its store through the environment (env://); a scheduler's
    # tasks meet at the address derived from the node list.
    init = "env://" if env.launcher == "torchrun" else \
        f"tcp://{env.master_addr}:{env.master_port}"
    if dist.is_initialized():
        _adopt(env, backend)
    else:
        dist.init_process_group(backend, init_method=init, rank=env.rank,
                                world_size=env.world_size, timeout=timeout)
        _OWN.append(None)  # the default group: leave() ends it
    control = dist.new_group(backend="gloo", timeout=timeout)
    checkpoints = dist.new_group(backend="gloo", timeout=timeout)
    _OWN.extend((control, checkpoints))
    hosts: list = [None] * env.world_size
    dist.all_gather_object(hosts, env.hostname, group=control)
    mesh = None
    if layout.model_parallel:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, layout.mesh_shape(),
                                mesh_dim_names=MESH_DIMENSIONS)
    return Distributed(env, layout, control, checkpoints, tuple(hosts), mesh)


def straggler(step_seconds: list[float], hosts: tuple[str, ...]) -> dict | None:
    """The slowest rank by mean step time, against the median rank."""
    if len(step_seconds) < 2:
        return None
    median = statistics.median(step_seconds)
    rank = max(range(len(step_seconds)), key=step_seconds.__getitem__)
    return {"rank": rank, "host": hosts[rank], "step_seconds": step_seconds[rank],
            "median_step_seconds": median,
            "ratio_to_median": step_seconds[rank] / median if median > 0 else None}


def collective_failure(err: Exception, env: ProcessEnv, where: str,
                       timeout: float) -> RunFailed | None:
    """A readable RunFailed for a collective that timed out or lost a peer, else None."""
    text = str(err)
    lowered = text.lower()
    if env.world_size == 1 or not any(
            key in lowered for key in ("timed out", "timeout", "connection closed",
                                       "connection reset", "broken pipe", "nccl")):
        return None
    first = text.strip().splitlines()[0][:300] if text.strip() else type(err).__name__
    return RunFailed(
        f"rank {env.rank} on {env.hostname}: a collective failed {where} (waited up to "
        f"parallel.timeout_seconds={timeout:g}): {first}. Another rank probably died, hangs "
        "or is far slower; see its log. If a slow step is expected (a long evaluation or "
        "checkpoint), raise parallel.timeout_seconds.")
