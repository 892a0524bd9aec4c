"""Timing on a device whose work runs asynchronously (CUDA): wait for it before reading the
clock. Shared by bench node and bench solve."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call(run, device: torch.device, seconds: float = 0.5, least: int = 3) -> float:
    """Seconds per call of `run`: warmed up, then repeated for about `seconds`."""
    run()
    synchronize(device)
    calls, start = 0, time.perf_counter()
    while calls < least or time.perf_counter() - start < seconds:
        run()
        calls += 1
        if device.type == "cuda" and calls % 5 == 0:
            synchronize(device)
    synchronize(device)
    return (time.perf_counter() - start) / calls


def best_of(run, repeats: int, device: torch.device):
    """(the shortest of `repeats` timed calls of `run`, the last call's result)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        result = run()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best, result
