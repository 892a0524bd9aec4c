"""How much memory this host can give a process now: what a model is checked against before
it is built in host memory (a config of 10^11 words would otherwise be a failed allocation, or
on an overcommitting kernel the OOM killer)."""

from __future__ import annotations

import os


def available_bytes() -> int | None:
    """The kernel's estimate of memory available without swapping (MemAvailable), else the
    free physical pages; None where neither can be read."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo.read(64 * 1024).splitlines():
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
