"""What a job asks for, whatever the scheduler: the request `hpctrain submit` and `tune`
build (GPUs, time, the recipe and its settings, the environment to load), its time limit in
seconds and its GPUs laid out over whole nodes of the cluster's profile. A scheduler turns it
into its own batch script (sbatch.py for Slurm)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.cluster.profiles import Profile
from hpctrain.errors import ConfigError

TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


@dataclass
class JobRequest:
    gpus: int
    time: str
    run_dir: Path
    recipe: str | None = None
    overrides: list[str] = field(default_factory=list)
    nodes: int | None = None
    job_name: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    constraint: str | None = None
    cpus_per_gpu: int | None = None
    mem: str | None = None
    modules: list[str] = field(default_factory=list)
    venv: str | None = None
    conda: str | None = None
    container: str | None = None
    script_options: list[str] = field(default_factory=list)  # more lines of the script
    max_requeues: int = 20
    sweep: list[list[str]] = field(default_factory=list)  # per array element: its overrides
    # instead of training: `hpctrain WORKER... --slot ELEMENT` in the batch shell of each of
    # `elements` array elements (a search's workers, which srun their trials themselves)
    worker: list[str] = field(default_factory=list)
    elements: int = 0
    resume_from: str | None = None  # a checkpoint the first start resumes (then: the newest)
    workdir: Path | None = None  # where the job runs: the submit directory
    user_code: bool = False  # the recipe names user code: the workdir goes on PYTHONPATH
    # `hpctrain autotune` first, with these arguments (--budget), on the job's GPUs; the run
    # trains its pick. None: no autotune
    autotune: list[str] | None = None

    @property
    def array(self) -> int:
        """Array elements: one per sweep element, or per worker; 0 for a plain job."""
        return len(self.sweep) or self.elements

    def python(self) -> tuple[list[str], str]:
        """(the command the job runs python as, which python that is, in words): the
        container's, the environment's you named (--venv, --conda: its python3), else the
        interpreter you submit from, which runs hpctrain now (a profile's modules still load
        first: a module's own python3 may lack hpctrain or carry an older torch)."""
        if self.container:
            return ["apptainer", "exec", "--nv", "--bind", str(self.run_dir.parent),
                    str(Path(self.container).expanduser()), "python3"], \
                f"python3 of the container {self.container}"
        if self.venv or self.conda:
            named = f"--venv {self.venv}" if self.venv else f"--conda {self.conda}"
            return ["python3"], f"python3 of {named}"
        virtual = " (a virtualenv)" if sys.prefix != sys.base_prefix else ""
        return [sys.executable], f"{sys.executable}, the interpreter you submit from{virtual}"


def time_seconds(text: str) -> int:
    """Slurm's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    match = TIME.match(text.strip())
    if not match:
        raise ConfigError(f"--time {text!r}: use Slurm's formats, e.g. 90 (minutes), 2:00:00, "
                          "or 1-12:00:00 (days-hours:minutes:seconds)")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # MM or MM:SS
        seconds = int(a) * 60 + int(b or 0)
    if seconds <= 0:
        raise ConfigError(f"--time {text!r} is zero")
    return seconds


def layout(gpus: int, nodes: int | None, profile: Profile) -> tuple[int, int]:
    """(nodes, GPUs per node) for `gpus`, filling whole nodes of the profile."""
    per_node = profile.gpus_per_node
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: give 1 or more")
    if nodes is not None and nodes < 1:
        raise ConfigError(f"--nodes {nodes}: give 1 or more, or leave it out (as few as the "
                          "profile allows)")
    if nodes is None:
        if gpus <= per_node:
            return 1, gpus
        if gpus % per_node:
            low, high = gpus // per_node * per_node, (gpus // per_node + 1) * per_node
            raise ConfigError(f"--gpus {gpus} does not fill whole nodes of {profile.name} "
                              f"({per_node} GPUs per node): use {low} or {high}, or give "
                              "--nodes with an equal share per node")
        return gpus // per_node, per_node
    if gpus % nodes or gpus // nodes > per_node:
        raise ConfigError(f"--gpus {gpus} on --nodes {nodes}: each node needs the same number "
                          f"of GPUs, at most {per_node} on {profile.name}")
    return nodes, gpus // nodes
