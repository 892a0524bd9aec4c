"""Choosing what a rank samples: its GPU through NVML, else the node's CPU packages through
RAPL, else nothing (and the reason, said once in the banner)."""

from __future__ import annotations

import torch

from hpctrain.monitor.gpu import DeviceIdentity, open_gpu, torch_identity
from hpctrain.monitor.rapl import open_rapl
from hpctrain.monitor.meter import Meter


def device_identity(device: torch.device) -> DeviceIdentity | None:
    """The GPU to find in NVML: torch's cuda device (None for the CPU)."""
    return torch_identity(device.index or 0) if device.type == "cuda" else None


def make_meter(device: torch.device, hostname: str, enabled: bool,
                 interval: float) -> Meter:
    """Not started yet (the loop starts it with the first step)."""
    if not enabled:
        return Meter(None, "", interval, "monitor.enabled=false")
    identity = device_identity(device)
    why_not = "no GPU"
    if identity is not None:
        gpu = open_gpu(identity)
        if not isinstance(gpu, str):
            return Meter(gpu, gpu.uuid, interval)
        why_not = gpu
    rapl = open_rapl()  # the CPU packages, named as such by energy_source
    if isinstance(rapl, str):
        return Meter(None, "", interval, f"{why_not}; {rapl}")
    return Meter(rapl, f"rapl:{hostname}", interval, why_not)
