"""One seed for everything a run draws from: Python's `random`, NumPy's global generator and
torch's, in the training process and, derived per worker and epoch, in each loader worker.

torch seeds a DataLoader worker's three generators once, when the worker starts; persistent
workers then run on from epoch to epoch, and a resumed run's fresh workers start from that
first seed again. So the data code reseeds a worker of your own dataset at the start of each
epoch from (seed, epoch, data-parallel rank, worker): two runs of one configuration draw the
same augmentations, and a run resumed at an epoch boundary draws what the undisturbed run drew.
Ranks that share a batch (tensor and pipeline parallelism) share the data rank, so they draw
alike; other ranks draw differently.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_process(seed: int) -> None:
    """Seed this process's `random`, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_worker(seed: int, epoch: int, rank: int, worker: int) -> None:
    """Seed a loader worker for one epoch, from the run's seed."""
    derived, = np.random.SeedSequence([seed, epoch, rank, worker]).generate_state(
        1, dtype=np.uint64)
    seed_process(int(derived))
