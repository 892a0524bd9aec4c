"""The recipe's `parallel` section and the closed set of data-parallel strategies.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import Field, field_validator

from hpctrain.sections import Auto, Section


class Strategy(str, Enum):
    """How the data dimension holds the model: the closed set of names, compared as members
    everywhere (parallel/layout.py decides which one a run gets)."""

    NONE = "none"  # one data-parallel copy: nothing to synchronise
    DDP = "ddp"  # a whole copy per process, gradients all-reduced
    FSDP = "fsdp"  # parameters, gradients and optimiser state sharded (FSDP2)

    def __str__(self) -> str:
        return self.value


class ParallelConfig(Section):
    data: int | Auto = Field("auto", description="processes in the data dimension (each a "
                             "share of the batch); auto: the world size / (tensor x pipeline)")
    tensor: int = Field(1, ge=1, description="processes that split each layer's matrices "
                        "(tensor parallelism, within one node)")
    pipeline: int = Field(1, ge=1, description="processes that each hold a run of the "
                          "model's blocks (pipeline parallelism)")
    strategy: Literal[("auto", *(member.value for member in Strategy))] = Field(
        "auto", description="the data dimension: auto is ddp with more than one process and "
        "only data parallelism, fsdp with tensor or pipeline parallelism, none with one")
    microbatches: int | Auto = Field("auto", description="pipeline parallelism: micro-batches "
                                     "per step (each rank's batch is split into them); auto: "
                                     "4 x parallel.pipeline, or the most that divide the batch")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"] = Field(
        "1f1b", description="pipeline parallelism: gpipe runs every micro-batch's forward, then "
        "every backward; 1f1b alternates, holding fewer micro-batches' activations; "
        "interleaved-1f1b and zero-bubble give each rank several stages (a smaller bubble), "
        "zero-bubble computes weight gradients apart to fill what is left")
    stage_split: Literal["equal", "parameters", "time"] = Field(
        "equal", description="pipeline parallelism: where the blocks are cut; equal runs, or "
        "runs balanced by the parameters (the embedding and the head count too) or by each "
        "block's measured forward and backward time")
    stages_per_rank: int | Auto = Field("auto", description="pipeline stages each rank holds "
                                        "(looped schedules); auto: 2 for interleaved-1f1b and "
                                        "zero-bubble, 1 otherwise")
    sequence_parallel: bool = Field(False, description="tensor parallelism: the norms and the "
                                    "residual stream split over the sequence too (less memory "
                                    "for activations)")
    loss_parallel: bool = Field(False, description="tensor parallelism (the GPT's plan): the "
                                "logits stay split over the vocabulary and the loss is computed "
                                "on the shares, never gathering the whole logits")
    tensor_plan: dict[str, Literal["colwise", "rowwise"]] = Field(
        default_factory=dict, description="tensor parallelism for a model without a built-in "
        "plan: module-name patterns (fnmatch, e.g. 'layers.*.fc1') -> colwise or rowwise")

    @field_validator("data", "microbatches", "stages_per_rank")
    @classmethod
    def _at_least_one(cls, value):
        if value != "auto" and value < 1:
            raise ValueError(f"{value} is too few: give 1 or more, or auto")
        return value
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="the process "
                                                     "group's: auto: nccl on GPUs, gloo on "
                                                     "the CPU")
    timeout_seconds: float = Field(600, gt=0, description="how long a collective may wait "
                                                          "for the other ranks")
    bucket_cap_mb: float = Field(25, gt=0, description="DDP gradient bucket size")
    gradient_as_bucket_view: bool = Field(True, description="DDP: gradients are views into "
                                          "the all-reduce buckets (no copy, less memory)")
    static_graph: bool = Field(False, description="DDP: the same parameters are used every "
                                                  "step (lets DDP skip per-step bookkeeping)")
    sync_batchnorm: bool = Field(False, description="batch norm's statistics over every "
                                 "data-parallel rank's batch (for small batches per device)")
    reshard_after_forward: bool = Field(True, description="FSDP: free gathered parameters "
                                                          "after forward (ZeRO-3); false: ZeRO-2")
    cpu_offload: bool = Field(False, description="FSDP: keep sharded parameters and optimiser "
                                                 "state in host memory")
