"""Whether a candidate fits, from `hpctrain memory`'s prediction, before it costs a trial.

On a GPU the capacity is the card's; on a CPU, the memory this machine has available now,
shared by the run's processes. A candidate the prediction cannot tell (a model it cannot
trace) is run: the trial says.
"""

from __future__ import annotations

import os

from hpctrain.config import Config
from hpctrain.units import fmt_bytes


def available_host_memory() -> int:
    """MemAvailable of /proc/meminfo (what can be had without swapping), else free pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def predicted_misfit(config: Config, processes: int = 1) -> str | None:
    """Why `config` does not fit this machine's device, by the prediction; None when it
    fits or the prediction cannot tell."""
    from hpctrain.errors import UserError
    from hpctrain.memory.estimate import estimate, resolve_target
    from hpctrain.train.hardware.system import resolve_device

    on_cpu = resolve_device(config.device).type == "cpu"
    capacity = f"{available_host_memory() // processes}B" if on_cpu else None
    try:
        where = config.model_copy(update={"device": "cpu"}) if on_cpu else config
        found = estimate(where, resolve_target(where, capacity, processes))
    except (UserError, RuntimeError, ValueError, NotImplementedError):
        return None
    if found.fits:
        return None
    source = "available on this machine" if on_cpu else found.target.capacity_source
    return f"predicted {fmt_bytes(found.in_use)} of {fmt_bytes(found.target.capacity)} ({source})"
