"""How the processes of a run divide the work: the data, tensor and pipeline dimensions.

`parallel.data x parallel.tensor x parallel.pipeline` processes make one run. Ranks are laid
out pipeline-major and tensor-innermost, as torchtitan does it: the `tensor` consecutive ranks
of a tensor-parallel group are started on one node by torchrun and the scheduler's launcher
alike, so the
activations they exchange at every layer never leave the node. Everything here is decided
from the configuration and the process environment alone, before any process group exists:
a layout that cannot work is refused on every rank alike, with the sizes that would work,
instead of hanging in the first collective.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.cluster.records import ProcessEnv
from hpctrain.config import Config, Strategy
from hpctrain.errors import ConfigError


# the run's DeviceMesh, outermost first: data-parallel copies are replicated (DDP) or sharded
# (FSDP), so one of those two has the data size and the other 1
MESH_DIMENSIONS = ("pipeline", "replicate", "shard", "tensor")
FSDP_DIMENSIONS = ("replicate", "shard")  # the mesh's dimensions FSDP replicates and shards


@dataclass(frozen=True)
class Layout:
    """The one answer to "how do the processes divide the work": every rule of it lives
    here, and training (`resolve_layout`) and `hpctrain memory` (`split_world`) both ask it."""

    data: int  # data-parallel replicas (or FSDP shards): each trains on its share of the batch
    tensor: int = 1  # ranks that split each layer's matrices
    pipeline: int = 1  # ranks that each hold a run of consecutive blocks
    strategy: Strategy = Strategy.NONE  # how the data dimension holds the model

    @property
    def ranks_per_stage(self) -> int:
        """Ranks that hold one pipeline stage (all of them without a pipeline); a rank's
        neighbouring stage is this many ranks away."""
        return self.data * self.tensor

    @property
    def world_size(self) -> int:
        return self.data * self.tensor * self.pipeline

    @property
    def model_parallel(self) -> bool:
        """Whether one model copy spans several processes (then the run has a DeviceMesh)."""
        return self.tensor > 1 or self.pipeline > 1

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pipeline stage, data index, tensor index) of `rank`."""
        rest, tensor = divmod(rank, self.tensor)
        stage, data = divmod(rest, self.data)
        return stage, data, tensor

    def data_index(self, rank: int) -> int:
        """Which share of each batch `rank` trains on (the ranks of one model copy share
        theirs)."""
        return self.coordinates(rank)[1]

    def reports(self, rank: int) -> bool:
        """Whether `rank`'s figures count: one rank per data share (the first of its
        tensor-parallel group, which all compute the same loss, on the last pipeline stage,
        the only one that has a loss)."""
        stage, _, tensor = self.coordinates(rank)
        return tensor == 0 and stage == self.pipeline - 1

    def model_share(self, parameters: int, block_parameters: int, split_parameters: int) -> float:
        """The fraction of a model's parameters one device holds under tensor and pipeline
        parallelism (before any FSDP sharding): a stage holds its share of the repeated blocks
        and the rest whole; tensor parallelism splits the `split_parameters` `tensor` ways."""
        if parameters == 0:
            return 1.0
        stage = (block_parameters / self.pipeline + parameters - block_parameters) / parameters
        split = split_parameters / parameters if self.tensor > 1 else 0.0
        return min(1.0, stage) * (1 - split + split / self.tensor)

    def activation_share(self, sequence_parallel: bool, microbatches: int,
                         schedule: str) -> float:
        """The fraction of one device's activations left under tensor and pipeline
        parallelism: of a transformer block's 34 activation bytes per element, tensor
        parallelism splits 24 (all of them with sequence parallelism); a pipeline stage holds
        its micro-batches in flight (all of them under GPipe, up to one per stage under 1F1B)."""
        t, p, m = self.tensor, self.pipeline, microbatches
        share = 1 / t if sequence_parallel else (10 + 24 / t) / 34
        if p > 1:
            in_flight = m if schedule == "gpipe" else min(p, m)
            share *= in_flight / (m * p)
        return share

    def mesh_shape(self) -> tuple[int, int, int, int]:
        """The DeviceMesh's sizes along MESH_DIMENSIONS."""
        ddp = self.strategy == Strategy.DDP
        return (self.pipeline, self.data if ddp else 1, 1 if ddp else self.data, self.tensor)

    def settings(self) -> list[str]:
        """The model-parallel part of this layout as recipe settings (none for data
        parallelism alone, which is the processes started)."""
        return [f"parallel.{name}={size}" for name, size in
                (("tensor", self.tensor), ("pipeline", self.pipeline)) if size > 1]

    def describe(self) -> str:
        parts = [f"data {self.data} ({self.strategy})" if self.data > 1 else None,
                 f"tensor {self.tensor}" if self.tensor > 1 else None,
                 f"pipeline {self.pipeline}" if self.pipeline > 1 else None]
        return " x ".join(p for p in parts if p) or "one process"


def _splits(world: int) -> str:
    """The (tensor, pipeline) pairs that fit `world` processes, as settings."""
    pairs = [(t, world // t) for t in range(1, world + 1) if world % t == 0]
    return ", ".join(f"tensor={t} pipeline={p}" for t, p in pairs[:8])


def model_copy(config: Config) -> tuple[int, str]:
    """(the processes one model copy spans, the settings that say so)."""
    p = config.parallel
    return p.tensor * p.pipeline, f"parallel.tensor={p.tensor} x parallel.pipeline={p.pipeline}"


def layout_of(config: Config, world: int, started: str) -> Layout | None:
    """The recipe's layout on `world` processes (`split_world`): training's, once its
    processes are checked (`resolve_layout`), and `hpctrain memory`'s for --world-size."""
    p = config.parallel
    return split_world(world, p.tensor, p.pipeline, p.strategy, started)


def resolve_layout(config: Config, env: ProcessEnv) -> Layout:
    """The run's layout for the processes `env` says were started, or a ConfigError."""
    p = config.parallel
    world = env.world_size
    per_copy, named = model_copy(config)
    if p.data == "auto":
        if world % per_copy:
            raise ConfigError(
                f"{named} is {per_copy} processes per model copy, but {world} process(es) were "
                f"started ({env.launcher}): start a multiple of {per_copy}, or with {world} use "
                f"one of: {_splits(world)}")
    else:
        data = p.data
        if data * per_copy != world:
            fits = f"parallel.data={world // per_copy}" if world % per_copy == 0 else \
                f"parallel.data=1 with one of: {_splits(world)}"
            raise ConfigError(
                f"parallel.data={data} x {named} is {data * per_copy} processes, but {world} "
                f"were started ({env.launcher}): with {world} use {fits}, or parallel.data=auto")
    if p.tensor > 1 and env.local_world_size % p.tensor:
        divisors = [d for d in range(1, env.local_world_size + 1)
                    if env.local_world_size % d == 0]
        raise ConfigError(
            f"parallel.tensor={p.tensor}: a tensor-parallel group exchanges activations at "
            f"every layer and must sit on one node, but {env.hostname} runs "
            f"{env.local_world_size} process(es); use parallel.tensor="
            f"{' or '.join(map(str, divisors))}, or start a multiple of {p.tensor} processes "
            "per node")
    return layout_of(config, world, f"{env.world_size} processes, {env.launcher}")


def split_world(world: int, tensor: int, pipeline: int, wanted: str,
                started: str) -> Layout | None:
    """`world` processes as model copies of `tensor` x `pipeline` ranks, the strategy by
    `choose_strategy`; None where `world` is not a multiple of a copy (the caller names its
    own setting: the processes started, or memory's --world-size)."""
    per_copy = tensor * pipeline
    if world % per_copy:
        return None
    data = world // per_copy
    return Layout(data, tensor, pipeline, choose_strategy(wanted, data, per_copy > 1, started))


# pipeline micro-batches per stage by default: the bubble, (p - 1) / (m + p - 1), is then
# under a fifth
MICROBATCHES_PER_STAGE = 4


def microbatches(config: Config, layout: Layout, batch_size: int) -> int:
    """Pipeline micro-batches per step: parallel.microbatches, or MICROBATCHES_PER_STAGE per
    stage, fewer where the per-device batch does not split that far."""
    wanted = config.parallel.microbatches
    fits = [m for m in range(1, batch_size + 1) if batch_size % m == 0]
    if wanted == "auto":
        wanted = max(m for m in fits if m <= MICROBATCHES_PER_STAGE * layout.pipeline)
    elif batch_size % wanted:
        raise ConfigError(f"parallel.microbatches={wanted} does not divide the per-device batch "
                          f"of {batch_size}; use one of {', '.join(map(str, fits[:12]))}")
    if wanted < layout.pipeline and config.parallel.schedule == "1f1b":
        raise ConfigError(
            f"parallel.schedule=1f1b needs at least as many micro-batches as stages "
            f"({layout.pipeline}), but the per-device batch of {batch_size} gives {wanted}: "
            "raise the batch (train.batch_size or train.global_batch_size), or use "
            "parallel.schedule=gpipe")
    return wanted


def choose_strategy(wanted: str, data: int, model_parallel: bool, started: str) -> Strategy:
    """The one rule for parallel.strategy: none with one data-parallel copy; auto is FSDP
    where one copy spans processes (tensor or pipeline), else DDP; `none` with several copies
    is refused (`started`: the processes, for the message)."""
    if data == 1:
        return Strategy.NONE
    if wanted == Strategy.NONE:
        raise ConfigError(
            f"parallel.strategy=none, but {data} data-parallel copies of the model were "
            f"started ({started}): each would train its own copy. Use parallel.strategy=ddp, "
            "fsdp or auto, or start fewer processes.")
    if wanted == "auto":
        return Strategy.FSDP if model_parallel else Strategy.DDP
    return Strategy(wanted)
