"""Kineto's log level, which it reads once, as torch loads: call before importing torch.

Without a GPU, torch's profiler (hpctrain profile, memory --measure) only logs that it found
none, and a USDT line at each start and stop: level 5 silences the rest, 6 those lines too.
Torch-free, so that the CLI and the benchmarks can set it first.
"""

from __future__ import annotations

import os
from pathlib import Path


def quiet_without_gpu() -> None:
    """Silence Kineto where no NVIDIA device is; a level the user set is kept."""
    if not Path("/dev/nvidiactl").exists():
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
