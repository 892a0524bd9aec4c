"""What the scheduler seam (scheduler.py) speaks in: which process of which run this is
(`ProcessEnv`, as the launcher said it: every room reads it instead of the environment, which
cluster/environment.py reads once, at build), a job as the scheduler knows it (`JobElement`)
and its state in hpctrain's words (`STATES`, into which each scheduler translates its own),
and the error of a scheduler that is missing or refuses."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.errors import ConfigError, UserError

# a job's state, as hpctrain speaks of it whatever the scheduler: waiting or working...
WAITING = {"PENDING", "REQUEUED", "SUSPENDED"}
WORKING = {"RUNNING"}
# ... or ended, for good (a requeued job is not)
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
UNKNOWN = "UNKNOWN"  # the scheduler no longer knows the job, or says what hpctrain does not
STATES = WAITING | WORKING | FINAL_STATES | {UNKNOWN}


@dataclass(frozen=True)
class ProcessEnv:
    launcher: str  # single | torchrun | a scheduler's name (slurm)
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    hostname: str
    job_id: str | None  # the scheduler's job, when there is one (also torchrun in one)
    restart_count: int = 0  # how often the job was requeued or continued
    script_continues: bool = False  # an `hpctrain submit` script submits the continuation
    cluster: str | None = None  # the scheduler's cluster name, when in a job
    runs_db: str | None = None  # HPCTRAIN_DB: a shared runs index the run registers in

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def by_scheduler(self) -> bool:
        """Started by a scheduler's own launcher (a step of its job), which may bind one GPU
        to each task and leaves the rendezvous to the address of the node list."""
        return self.launcher not in ("single", "torchrun")


MOST_PROCESSES = 1 << 20  # a million processes: more is no launcher's doing
MOST_RESTARTS = 1_000_000


def whole_number(environ: Mapping[str, str], *names: str, default: int | None = None,
                 low: int = 0, high: int = MOST_PROCESSES) -> int:
    """The first of the launcher's variables `names` that is set, a whole number from `low`
    to `high`; else `default`. Checked before any process group exists: a rank of -1 or a
    process count of 0 would fail deep in torch.distributed."""
    for name in names:
        text = environ.get(name, "").strip()
        if text:
            whole = re.fullmatch(r"[+-]?[0-9]+", text) is not None
            if not whole or len(text) > 20 or not low <= int(text) <= high:
                shown = text if len(text) <= 20 else text[:17] + "..."
                kind = f"not a whole number from {low} to {high:,}" if whole else \
                    "not a whole number"
                raise ConfigError(f"the environment variable {name}={shown!r} is {kind}; the "
                                  "launcher sets it, so unset or fix what changed it")
            return int(text)
    if default is None:
        raise ConfigError(f"the launcher did not set {' or '.join(names)}")
    return default


def below(value: int, name: str, count: int, count_name: str) -> None:
    """`value` (a rank, the variable `name`) must be below `count` (`count_name`): a rank
    past the process count would wait in the rendezvous forever."""
    if value >= count:
        raise ConfigError(f"{name}={value} but {count_name}={count}: ranks count from 0 to "
                          f"{count - 1}, so this process would wait for the others forever; "
                          "the launcher sets both, so unset or fix what changed them")


class ClusterError(UserError):
    """The scheduler is not there, or refused the request (its message is kept)."""


@dataclass(frozen=True)
class JobElement:
    """A job, or one element of an array job, as the scheduler knows it while it is queued,
    running or recently finished."""

    state: str
    reason: str | None
    restarts: int  # how often the scheduler itself requeued it
    element: str | None  # the array element's index; None for a plain job
    stdout: str | None  # its log files as the scheduler names them (may hold patterns)
    stderr: str | None
