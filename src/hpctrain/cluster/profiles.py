"""Cluster profiles: what a node of a partition holds, so `--gpus N` is enough to submit.

Shipped profiles live in clusters.yaml beside this module; a user's own file
(~/.config/hpctrain/clusters.yaml, or the path in HPCTRAIN_CLUSTERS) adds or replaces
profiles by name. The profile in use is --cluster NAME, else HPCTRAIN_CLUSTER, else
'generic'.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hpctrain.config import read_yaml_mapping
from hpctrain.errors import ConfigError

USER_FILE = Path("~/.config/hpctrain/clusters.yaml")


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "generic"
    description: str = ""
    scheduler: str | None = None  # its batch scheduler (scheduler.SCHEDULERS; None: DEFAULT)
    gpus_per_node: int = Field(4, ge=1)
    cpus_per_gpu: int = Field(8, ge=1)
    mem_per_gpu: str | None = None  # e.g. "60G"; None: the partition's default
    partition: str | None = None
    qos: str | None = None
    constraint: str | None = None
    account_suffix: str = ""  # appended to --account (Jean Zay: proj@a100)
    max_time: str | None = None  # the partition's limit, HH:MM:SS or D-HH:MM:SS
    modules: list[str] = Field(default_factory=list)
    signal_lead_seconds: int = Field(300, ge=30, description="preemption signal before the end")


def _read(path: Path) -> dict:
    return read_yaml_mapping(path, "a cluster profiles file")


def load_profiles(environ: Mapping[str, str] | None = None) -> dict[str, Profile]:
    """Shipped profiles, then the user's (which win on equal names)."""
    env = os.environ if environ is None else environ
    shipped = Path(str(resources.files("hpctrain") / "cluster" / "clusters.yaml"))
    sources = {name: (shipped, tree) for name, tree in _read(shipped).items()}
    user = Path(env.get("HPCTRAIN_CLUSTERS") or USER_FILE).expanduser()
    if user.is_file():
        sources.update({name: (user, tree) for name, tree in _read(user).items()})
    elif env.get("HPCTRAIN_CLUSTERS"):
        raise ConfigError(f"HPCTRAIN_CLUSTERS={user}: no such file")
    profiles = {}
    for name, (path, tree) in sources.items():
        try:
            profiles[name] = Profile(name=name, **(tree or {}))
        except (ValidationError, TypeError) as err:
            raise ConfigError(f"cluster profile {name!r} in {path}: {err}") from None
    return profiles


def get_profile(name: str | None, environ: Mapping[str, str] | None = None) -> Profile:
    env = os.environ if environ is None else environ
    profiles = load_profiles(env)
    wanted = name or env.get("HPCTRAIN_CLUSTER") or "generic"
    if wanted not in profiles:
        hint = difflib.get_close_matches(wanted, profiles, n=1)
        raise ConfigError(f"unknown cluster profile {wanted!r}"
                          + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; known: {', '.join(sorted(profiles))}. Add your own to "
                          f"{USER_FILE} (see 'hpctrain submit --help').")
    return profiles[wanted]
