"""How long this process has lived, as the operating system records it.

A job's seconds count from its process's start, not from hpctrain's own clock, which starts
after the interpreter and its imports (torch's take seconds): `hpctrain goodput` would
otherwise miss them in every job. Linux records a process's start in clock ticks since boot
(/proc/self/stat, field 22); the boot clock says where that stands now.
"""

from __future__ import annotations

import os
import time


def seconds_alive() -> float:
    """Seconds since this process started (0.0 where the system does not say)."""
    try:
        fields = open("/proc/self/stat", "rb").read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of the whole line: starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) -
                   ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def started_at() -> float:
    """When this process started, on time.perf_counter's clock."""
    return time.perf_counter() - seconds_alive()


def started_epoch() -> float:
    """When this process started, in Unix seconds."""
    return time.time() - seconds_alive()
