"""Which processes this run is made of: one process, torchrun workers, or Slurm srun tasks.

Read once, at build, from the environment the launcher left: nothing deeper in the code reads
environment variables. Under srun the rendezvous address comes from the step's node list,
expanded here (no `scontrol show hostnames` needed, so it also works inside containers), and
the port from the job id, so every task of a step computes the same address on its own.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import ConfigError


@dataclass(frozen=True)
class ProcessEnv:
    launcher: str  # single | torchrun | slurm
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    hostname: str
    job_id: str | None  # the Slurm job, when there is one (also for torchrun inside a job)
    restart_count: int = 0  # how often the job was requeued or continued
    script_continues: bool = False  # an `hpctrain submit` script submits the continuation
    cluster: str | None = None  # Slurm's cluster name, when in a job
    runs_db: str | None = None  # HPCTRAIN_DB: a shared runs index the run registers in

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list, e.g. 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07 login1.
    Ranges keep their zero padding; several bracket groups in one name multiply out."""
    return list(hosts_of(text))


def hosts_of(text: str) -> Iterator[str]:
    """expand_hostlist one host at a time: the first of 'n[0-999999999]' without the rest."""
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        yield from _expand_one(item)


def _expand_one(name: str) -> Iterator[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if match is None:
        yield name
        return
    head, tail = name[:match.start()], name[match.end():]
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or not (high.isdigit() or not high):
            raise ConfigError(f"cannot read the Slurm host list {name!r} ({part!r} is not a "
                              "number or a range of numbers)")
        for number in range(int(low), int(high or low) + 1):
            yield from _expand_one(f"{head}{number:0{len(low)}d}{tail}")


MAX_NODES = 1_000_000  # beyond any machine: a layout that says more is damaged


def tasks_per_node(text: str) -> list[int]:
    """Slurm's task layout, e.g. '4(x2),3' -> [4, 4, 3]."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None or len(counts) + int(match.group(2) or 1) > MAX_NODES:
            raise ConfigError(f"cannot read the Slurm task layout {text!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def port_for_job(job_id: str) -> int:
    """A port every task of the job derives alike; spread so that jobs sharing a node rarely
    collide."""
    digits = re.sub(r"\D", "", job_id) or "0"
    return 20000 + int(digits) % 40000


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        if environ.get(name, "").strip():
            try:
                return int(environ[name])
            except ValueError:
                raise ConfigError(f"the environment variable {name}={environ[name]!r} is not "
                                  "a whole number; the launcher sets it, so unset or fix "
                                  "what changed it") from None
    if default is None:
        raise ConfigError(f"the launcher did not set {' or '.join(names)}")
    return default


# the node-local folder a job may fill: the scheduler's per-job scratch, else the system's
NODE_LOCAL_VARIABLES = ("SLURM_TMPDIR", "TMPDIR")


def node_local_scratch(environ: Mapping[str, str] | None = None) -> Path | None:
    """This node's scratch folder for the job (the first of NODE_LOCAL_VARIABLES set), or
    None when there is none."""
    env = os.environ if environ is None else environ
    return next((Path(env[name]) for name in NODE_LOCAL_VARIABLES if env.get(name)), None)


def in_job(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a scheduler's job (its tasks are started with srun)."""
    env = os.environ if environ is None else environ
    return bool(env.get("SLURM_JOB_ID"))


def detect(environ: Mapping[str, str] | None = None) -> ProcessEnv:
    """The process layout from the launcher's variables: torchrun first (it may run inside a
    Slurm job), then an srun step, else a single process."""
    env = os.environ if environ is None else environ
    found = _layout(env)
    # Slurm's own requeues, plus the continuations in new jobs that hpctrain's scripts submit
    restarts = _int(env, "SLURM_RESTART_COUNT", default=0) + _int(env, "HPCTRAIN_RESTARTS",
                                                                   default=0)
    return dataclasses.replace(found, restart_count=restarts,
                               script_continues=env.get("HPCTRAIN_CONTINUES") == "script",
                               cluster=env.get("SLURM_CLUSTER_NAME") or None,
                               runs_db=env.get("HPCTRAIN_DB") or None)


def _layout(env: Mapping[str, str]) -> ProcessEnv:
    host = socket.gethostname()
    job_id = env.get("SLURM_JOB_ID")
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE", default=world)
        return ProcessEnv(
            launcher="torchrun", rank=_int(env, "RANK"), world_size=world,
            local_rank=_int(env, "LOCAL_RANK", default=0), local_world_size=local_world,
            node_rank=_int(env, "GROUP_RANK", default=0),
            num_nodes=max(1, world // max(local_world, 1)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT", default=29500), hostname=host, job_id=job_id)
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        return _slurm_step(env, host, job_id)
    return ProcessEnv("single", 0, 1, 0, 1, 0, 1, "127.0.0.1", 0, host, job_id)


def _slurm_step(env: Mapping[str, str], host: str, job_id: str | None) -> ProcessEnv:
    world = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    layout_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") \
        or str(world)
    layout = tasks_per_node(layout_text)
    if len(set(layout)) > 1:
        raise ConfigError(
            f"Slurm placed an unequal number of tasks on the nodes ({layout_text}: "
            f"{', '.join(map(str, layout))}); data-parallel training needs the same number on "
            "each node. Ask for --ntasks-per-node=K (with --nodes=N) instead of --ntasks.")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or host
    master = env.get("MASTER_ADDR") or next(hosts_of(nodelist), host)
    port = _int(env, "MASTER_PORT", default=port_for_job(job_id or "0"))
    return ProcessEnv(
        launcher="slurm", rank=_int(env, "SLURM_PROCID"), world_size=world,
        local_rank=_int(env, "SLURM_LOCALID", default=0), local_world_size=layout[0],
        node_rank=_int(env, "SLURM_NODEID", default=0), num_nodes=len(layout),
        master_addr=master, master_port=port, hostname=host, job_id=job_id)
