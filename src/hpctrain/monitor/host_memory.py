"""How much memory this process can be given now, and what bounds it: what a model is checked
against before it is built in host memory (a config of 10^11 words would otherwise be a failed
allocation, or on an overcommitting kernel the OOM killer).

Three bounds, the tightest said: the host's available memory (MemAvailable); the job's memory
limit, where a scheduler confines the job to a cgroup (Slurm's `--mem`: the host's figure is
the whole node's); and the process's address-space limit (`ulimit -v`, RLIMIT_AS), less what it
maps already, past which an allocation fails with a MemoryError however much memory is free.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from hpctrain.readers import read_text_capped

CGROUPS = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Room:
    """Bytes this process may still take, and what bounds them, said in a message."""

    bytes: int
    bound: str


def room() -> Room | None:
    """The tightest of the bounds above; None where none can be read."""
    found = [r for r in (_available(), _cgroup(), _address_space()) if r is not None]
    return min(found, key=lambda r: r.bytes) if found else None


def _small(path: Path | str) -> str | None:
    """A /proc or /sys file's text (a few lines), None where it cannot be read."""
    try:
        return read_text_capped(Path(path))
    except (OSError, ValueError):
        return None


def _field(path: str, name: str) -> int | None:
    """A `NAME:  N kB` line's bytes in a /proc file, None where it is not there."""
    for line in (_small(path) or "").splitlines():
        words = line.split()
        if words[:1] == [name] and len(words) > 1 and words[1].isdigit():
            return int(words[1]) * 1024
    return None


def _available() -> Room | None:
    """The kernel's estimate of memory available without swapping (MemAvailable), else the
    free physical pages."""
    available = _field("/proc/meminfo", "MemAvailable:")
    if available is not None:
        return Room(available, "memory available here")
    try:
        return Room(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
                    "memory available here")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space() -> Room | None:
    """The address-space limit less what this process maps (VmSize)."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    mapped = _field("/proc/self/status", "VmSize:") or 0
    return Room(max(0, limit - mapped), f"memory the process's address-space limit (ulimit -v "
                f"{limit / 2**30:,.1f} GiB, {mapped / 2**30:,.1f} GiB mapped) leaves")


def _cgroup() -> Room | None:
    """The tightest memory limit of this process's cgroup and those above it, less what they
    use: cgroup v2 (memory.max, memory.current), else v1 (memory.limit_in_bytes, _usage_)."""
    tightest = None
    for folder, limit_file, usage_file in _cgroup_folders():
        limit, used = _small(folder / limit_file), _small(folder / usage_file)
        if limit is None or used is None or not limit.strip().isdigit() or \
                not used.strip().isdigit() or int(limit) >= 1 << 60:  # v1's "no limit"
            continue
        left = max(0, int(limit) - int(used))
        if tightest is None or left < tightest.bytes:
            tightest = Room(left, f"memory the job's limit ({int(limit) / 2**30:,.1f} GiB, its "
                                  "cgroup) leaves")
    return tightest


def _cgroup_folders() -> list[tuple[Path, str, str]]:
    """This process's memory cgroup folders, its own up to the root, with their files."""
    found = []
    for line in (_small("/proc/self/cgroup") or "").splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2's one hierarchy
            base, files = CGROUPS, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = CGROUPS / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        folder = base / path.strip().lstrip("/")
        while True:
            found.append((folder, *files))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return found
