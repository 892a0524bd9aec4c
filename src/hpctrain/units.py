"""How hpctrain prints sizes: one way, in the terminal's summary, the run report and `memory`
alike."""

from __future__ import annotations


def fmt_bytes(n: float) -> str:
    """1.5 GiB, 320 MiB, 12 KiB: binary units, as the CUDA allocator and nvidia-smi count."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.{1 if abs(n) / size < 100 else 0}f} {unit}"
    return f"{n:.0f} B"
