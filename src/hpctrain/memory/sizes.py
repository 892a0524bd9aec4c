"""Device memory sizes: parsing what users type (`80GB`, `40GiB`, `h100`); printing them is
units.py's.

Units are taken literally: GB = 10^9 bytes, GiB = 2^30. A GPU's name gives the memory its
driver reports (nvidia-smi's total), which is what a run can address.
"""

from __future__ import annotations

import re

from hpctrain.errors import ConfigError

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
MIB = 2**20
# total memory as nvidia-smi reports it, in MiB
GPUS = {"v100-16gb": 16160, "v100-32gb": 32510, "a100-40gb": 40960, "a100-80gb": 81920,
        "h100": 81559, "h100-80gb": 81559, "h100-94gb": 95830, "h200": 143771,
        "gh200": 97871, "l40s": 46068, "a40": 46068, "mi250x": 65520, "mi300x": 196592}
WITHOUT_BF16 = {"v100-16gb", "v100-32gb"}  # Volta: fp16 Tensor Cores only
# compute capability, which decides the attention kernel (memory/attention.py)
CAPABILITY = {"v100-16gb": (7, 0), "v100-32gb": (7, 0), "a100-40gb": (8, 0),
              "a100-80gb": (8, 0), "h100": (9, 0), "h100-80gb": (9, 0), "h100-94gb": (9, 0),
              "h200": (9, 0), "gh200": (9, 0), "l40s": (8, 9), "a40": (8, 6)}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_memory(text: str, what: str = "--gpu-memory") -> int:
    """Bytes from '80GB', '79.6GiB', '81559MiB', '40g' or a GPU name such as 'a100-40gb'."""
    key = text.strip().lower()
    if key in GPUS:
        return GPUS[key] * MIB
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in UNITS or float(match.group(1)) <= 0:
        raise ConfigError(
            f"{what} {text!r} is not a memory size: give a number with a unit (80GB, 40GiB, "
            f"81559MiB) or a GPU name ({', '.join(sorted(GPUS))})")
    return int(float(match.group(1)) * UNITS[unit])


def lacks_bf16(gpu_memory: str | None) -> bool:
    """Is --gpu-memory the name of a GPU without bf16 (so `precision=auto` means fp16)?"""
    return (gpu_memory or "").strip().lower() in WITHOUT_BF16


def gpu_capability(gpu_memory: str | None) -> tuple[int, int] | None:
    """The compute capability of the GPU --gpu-memory names (None: a size, or an AMD GPU)."""
    return CAPABILITY.get((gpu_memory or "").strip().lower())
