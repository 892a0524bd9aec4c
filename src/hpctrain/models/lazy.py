"""Lazy modules (`nn.LazyLinear`, `nn.LazyConv2d`, ...) made whole before anything counts them.

A lazy module has no parameters until its first forward sees an input's shape. hpctrain
counts a model's parameters (MFU, `hpctrain memory`), freezes, wraps (DDP, FSDP) and splits
them, and builds the optimiser before the first step, as torch's own wrappers need. So, as
torch's documentation advises, a model holding a lazy module is first called once on one
sample, without gradients and in eval mode (no running statistics move): that makes every
lazy parameter. A model without one is not called.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from hpctrain.errors import ConfigError


def lazy_modules(model: nn.Module) -> list[str]:
    """The names of the model's modules whose parameters are not made yet."""
    return [name or type(model).__name__ for name, module in model.named_modules()
            if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params()]


def materialise(model: nn.Module, dry_run: Callable[[nn.Module], object], name: str) -> None:
    """Make the lazy parameters of `model` by `dry_run(model)` (a forward on one sample);
    nothing when it has none. A dry run that fails is one line naming the lazy modules."""
    lazy = lazy_modules(model)
    if not lazy:
        return
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            dry_run(model)
    except Exception as err:  # the model's own forward: named, with what it raised
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise ConfigError(f"model.name {name}: its lazy modules ({', '.join(lazy[:3])}) take "
                          "their sizes from a first forward, which hpctrain makes on one "
                          f"sample before training, and it failed ({type(err).__name__}: "
                          f"{first}); give those modules their sizes") from None
    finally:
        model.train(training)
    if lazy_modules(model):
        raise ConfigError(f"model.name {name}: the lazy modules {', '.join(lazy_modules(model))}"
                          " were not called by a forward on one sample, so they have no "
                          "parameters; give them their sizes")
