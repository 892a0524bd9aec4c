"""Which processes this run is made of: one process, torchrun workers, or the tasks a
scheduler's launcher started (srun: slurm.py reads its step).

Read once, at build, from the environment the launcher left: nothing deeper in the code reads
environment variables.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from hpctrain.cluster import scheduler
from hpctrain.cluster.records import MOST_RESTARTS, ProcessEnv, below, whole_number
from hpctrain.errors import ConfigError


def node_local_scratch(environ: Mapping[str, str] | None = None) -> Path | None:
    """This node's scratch folder for the job (the scheduler's per-job scratch, else the
    system's TMPDIR), or None when there is none."""
    env = os.environ if environ is None else environ
    names = (scheduler.current(env).SCRATCH_VARIABLE, "TMPDIR")
    return next((Path(env[name]) for name in names if env.get(name)), None)


def detect(environ: Mapping[str, str] | None = None) -> ProcessEnv:
    """The process layout from the launcher's variables: torchrun first (it may run inside a
    scheduler's job), then the scheduler's own launcher (an srun step), else a single
    process."""
    env = os.environ if environ is None else environ
    job = scheduler.current(env)
    found = _layout(env, job)
    # the scheduler's own requeues, plus the continuations in new jobs that hpctrain's
    # scripts submit
    restarts = job.restarts(env) + whole_number(env, "HPCTRAIN_RESTARTS", default=0,
                                                high=MOST_RESTARTS)
    return dataclasses.replace(found, restart_count=restarts,
                               script_continues=env.get("HPCTRAIN_CONTINUES") == "script",
                               cluster=job.cluster_name(env),
                               runs_db=env.get("HPCTRAIN_DB") or None)


def _layout(env: Mapping[str, str], job: scheduler.Scheduler) -> ProcessEnv:
    host = socket.gethostname()
    job_id = job.current_job(env)
    if "RANK" in env and "WORLD_SIZE" in env:
        world = whole_number(env, "WORLD_SIZE", low=1)
        local_world = whole_number(env, "LOCAL_WORLD_SIZE", default=world, low=1)
        found = ProcessEnv(
            launcher="torchrun", rank=whole_number(env, "RANK"), world_size=world,
            local_rank=whole_number(env, "LOCAL_RANK", default=0), local_world_size=local_world,
            node_rank=whole_number(env, "GROUP_RANK", default=0),
            num_nodes=max(1, world // local_world),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=whole_number(env, "MASTER_PORT", default=29500, low=1, high=65535),
            hostname=host, job_id=job_id)
        below(found.rank, "RANK", world, "WORLD_SIZE")
        below(found.local_rank, "LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE")
        if local_world > world:
            raise ConfigError(f"LOCAL_WORLD_SIZE={local_world} but WORLD_SIZE={world}: a node "
                              "holds no more processes than the run; the launcher sets both, "
                              "so unset or fix what changed them")
        below(found.node_rank, "GROUP_RANK", found.num_nodes,
              "WORLD_SIZE / LOCAL_WORLD_SIZE (the nodes)")
        return found
    started = job.step(env, host)
    if started is not None:
        return started
    return ProcessEnv("single", 0, 1, 0, 1, 0, 1, "127.0.0.1", 0, host, job_id)
