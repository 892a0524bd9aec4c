"""Resolve a model name to a module: `torchvision:NAME`, `timm:NAME` or `hpctrain:NAME`.

A bare name is looked up among the built-in nets first, then timm. Weights are never
downloaded (compute nodes have no internet): models start from random initialisation.
"""

from __future__ import annotations

import difflib

from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.models import small

BUILTIN = {"resnet_small": small.resnet_small, "tiny_cnn": small.tiny_cnn}


def _unknown(source: str, name: str, known: list[str]) -> ConfigError:
    hint = difflib.get_close_matches(name, known, n=3)
    return ConfigError(f"model.name: {source} has no model {name!r}"
                       + (f"; close matches: {', '.join(hint)}" if hint else ""))


def build_model(name: str, num_classes: int, kwargs: dict | None = None) -> nn.Module:
    kwargs = dict(kwargs or {})
    source, _, model_name = name.rpartition(":")
    if source == "" and model_name in BUILTIN:
        source = "hpctrain"
    try:
        if source == "hpctrain":
            if model_name not in BUILTIN:
                raise _unknown(source, model_name, list(BUILTIN))
            return BUILTIN[model_name](num_classes=num_classes, **kwargs)
        if source == "torchvision":
            import torchvision

            known = torchvision.models.list_models()
            if model_name not in known:
                raise _unknown(source, model_name, known)
            return torchvision.models.get_model(model_name, weights=None,
                                                num_classes=num_classes, **kwargs)
        if source in ("timm", ""):
            import timm

            if not timm.is_model(model_name):
                raise _unknown("timm", model_name, timm.list_models())
            return timm.create_model(model_name, pretrained=False, num_classes=num_classes,
                                     **kwargs)
    except (TypeError, ValueError) as err:  # a bad entry in model.kwargs
        raise ConfigError(f"model.kwargs {kwargs} do not fit {name}: {err}") from None
    raise ConfigError(f"model.name {name!r}: unknown source {source!r}; use torchvision:NAME, "
                      f"timm:NAME or hpctrain:NAME (built-in: {', '.join(BUILTIN)})")
