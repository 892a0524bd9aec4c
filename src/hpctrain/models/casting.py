"""One autocast copy of an input that several layers take.

Autocast casts a layer's input to its dtype at every layer that takes it, and each layer keeps
its own copy for backward: the query, key and value projections of a block held three copies
of the width (4 bytes per token and width unit more than one, in bf16). Cast once before them,
they share one; the values are the same.
"""

from __future__ import annotations

import torch


def cast_once(x: torch.Tensor) -> torch.Tensor:
    """`x` in autocast's dtype where autocast is on for its device; else `x`."""
    device = x.device.type
    return x.to(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else x
