"""What every kind's datasets share: a held-out split drawn the same everywhere, and the
recipe's number of classes checked against the data's."""

from __future__ import annotations

import random

from hpctrain.errors import DataError


def hold_out(samples: list, fraction: float, seed: int) -> tuple[list, list]:
    """(kept, held out): `fraction` of `samples` (at least one) drawn by `seed`, the same on
    every rank and every restart; each part in the samples' order."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(samples) * fraction))
    val = sorted(order[:n_val])
    train = sorted(order[n_val:])
    return [samples[i] for i in train], [samples[i] for i in val]


def check_classes(data, train, val, num_classes: int):
    """(train, val, num_classes), where data.num_classes, if set, agrees with the data."""
    if data.num_classes is not None and data.num_classes != num_classes:
        raise DataError(f"data.num_classes={data.num_classes}, but the {data.dataset} data "
                        f"{data.path or ''} has {num_classes} classes: fix the recipe, or "
                        "point data.path at the dataset it was written for")
    return train, val, num_classes
