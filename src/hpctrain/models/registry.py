"""Resolve a model name to a module: `torchvision:NAME`, `timm:NAME` or `hpctrain:NAME`.

A bare name is looked up among the built-in nets first, then timm. Weights are never
downloaded (compute nodes have no internet): models start from random initialisation.
"""

from __future__ import annotations

import difflib
import inspect

from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.models import gpt, small

BUILTIN = {"resnet_small": small.resnet_small, "tiny_cnn": small.tiny_cnn,
           **gpt.named_sizes()}


def _unknown(source: str, name: str, known: list[str]) -> ConfigError:
    hint = difflib.get_close_matches(name, known, n=3)
    return ConfigError(f"model.name: {source} has no model {name!r}"
                       + (f"; close matches: {', '.join(hint)}" if hint else ""))


def _not_for_tokens(name: str) -> ConfigError:
    gpts = [n for n in BUILTIN if n.startswith("gpt_")]
    return ConfigError(f"model.name {name} is an image model, but the data is tokens "
                       f"(language modelling): use a language model, hpctrain:{gpts[0]} to "
                       f"hpctrain:{gpts[-1]}")


def _facts_taken(factory, facts: dict) -> dict:
    """The facts of the data (num_classes, vocab_size) that `factory` has a parameter for."""
    parameters = inspect.signature(factory).parameters
    return {k: v for k, v in facts.items() if k in parameters and v is not None}


def build_model(name: str, num_classes: int | None, kwargs: dict | None = None,
                vocab_size: int | None = None) -> nn.Module:
    """The model `name`, sized for the data: its classes, or its vocabulary for a language
    model (model.kwargs may set a larger vocabulary, never a smaller one)."""
    kwargs = dict(kwargs or {})
    source, _, model_name = name.rpartition(":")
    if source == "" and model_name in BUILTIN:
        source = "hpctrain"
    try:
        if source == "hpctrain":
            if model_name not in BUILTIN:
                raise _unknown(source, model_name, list(BUILTIN))
            factory = BUILTIN[model_name]
            facts = _facts_taken(factory, {"num_classes": num_classes,
                                           "vocab_size": vocab_size})
            if vocab_size is not None and "vocab_size" not in facts:
                raise _not_for_tokens(name)
            return factory(**{**facts, **kwargs})
        if vocab_size is not None:
            raise _not_for_tokens(name)
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
