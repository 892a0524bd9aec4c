"""Resolve a model name to a module: `torchvision:NAME`, `timm:NAME`, `hpctrain:NAME`,
`hf:PATH` (a transformers causal LM from a local config), or the user's own factory
(`package.module:build` or `path/to/file.py:build`, user_code.py).

A bare name is looked up among the built-in nets first, then timm. Weights are never
downloaded (compute nodes have no internet): models start from random initialisation, or
with model.pretrained from a library's cache (pretrained.py). timm's
ViT attention comes with its query, key and value projections apart (vit_attention.py), which
tensor parallelism needs.
"""

from __future__ import annotations

import difflib
import importlib

import torch
from torch import nn

from hpctrain import user_code
from hpctrain.data import kinds
from hpctrain.errors import ConfigError, UserError
from hpctrain.models import gpt, huggingface, sizing, small
from hpctrain.models import pretrained as weights
from hpctrain.models.vit_attention import split_fused_attention

BUILTIN = {"resnet_small": small.resnet_small, "tiny_cnn": small.tiny_cnn,
           **gpt.named_sizes(), **kinds.own_models()}  # and each data kind's own


def _unknown(source: str, name: str, known: list[str]) -> ConfigError:
    hint = difflib.get_close_matches(name, known, n=3)
    return ConfigError(f"model.name: {source} has no model {name!r}"
                       + (f"; close matches: {', '.join(hint)}" if hint else ""))


def _not_for_tokens(name: str) -> ConfigError:
    gpts = [n for n in BUILTIN if n.startswith("gpt_")]
    return ConfigError(f"model.name {name} is not a language model, but the data is tokens "
                       f"(language modelling): use a language model, hpctrain:{gpts[0]} to "
                       f"hpctrain:{gpts[-1]}")


def check_model_takes(name: str, kind: str) -> None:
    """A model for the data's kind (data/kinds.py: a kind's own models only on it; tokens
    are checked against the model's vocabulary when it is built), said before any data is
    read: the wrong one fails deep inside the first forward pass. User code is imported
    here, so that it fails early too."""
    if user_code.is_code_reference(name):
        user_code.load(name, "model.name")  # it imports; what it takes, its first batch tells
        return
    data = kinds.spec(kind)
    if data.vocabulary:
        return
    if name.startswith("hf:"):
        token_data = [dataset for other in kinds.KINDS.values() if other.vocabulary
                      for dataset in other.datasets]
        raise ConfigError(f"model.name {name} is a language model, but the data is "
                          f"{data.samples_word}: give it token data (data.dataset="
                          f"{' or '.join(token_data)})")
    source, _, model_name = name.rpartition(":")
    made_for = kinds.for_models().get(model_name) if source in ("", "hpctrain") else None
    if made_for is not None and made_for is not data:
        raise ConfigError(f"model.name {name} is {made_for.model_word}, but the data is "
                          f"{data.samples_word}: use {data.model_hint}")
    if made_for is None and data.only_its_models:
        raise ConfigError(f"model.name {name} does not take {data.samples_word}, but the data "
                          f"is {data.samples_word}: use {data.model_hint}")


def user_model(name: str, num_classes: int | None, kwargs: dict, vocab_size: int | None,
               image_sizes: tuple[int, ...]) -> nn.Module:
    """The user's factory called with model.kwargs and the facts of the data it asks for by
    parameter name: num_classes, vocab_size, image_size (when the run feeds one size)."""
    factory = user_code.load(name, "model.name")
    facts = {"num_classes": num_classes, "vocab_size": vocab_size}
    if image_sizes:
        if len(set(image_sizes)) > 1 and user_code.facts_taken(factory, {"image_size": 0}):
            raise ConfigError(f"model.name {name} takes one image_size, but this recipe feeds "
                              f"it {sorted(set(image_sizes))} px (data.images.image_size, "
                              "data.images.val_image_size, progressive resizing): use one size")
        facts["image_size"] = image_sizes[0]
    model = user_code.call_factory(factory, "model.name", name, facts, kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.name {name} returned a {type(model).__name__}, not a "
                          "torch.nn.Module: the factory must return the model itself")
    return model


def _sized_for(model_name: str, kwargs: dict, image_sizes: tuple[int, ...]) -> dict:
    """timm models made for one input size (ViT, Swin, ...) are built for the data's size
    ({"img_size": size}), where timm would stop the first forward pass with an assertion; a
    recipe that feeds such a model several sizes is refused."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(model_name)
    sizes = sorted(set(image_sizes))
    if cfg is None or not cfg.fixed_input_size or not sizes:
        return {}
    made_for = kwargs.get("img_size", cfg.input_size[-1])
    if len(sizes) > 1:
        raise ConfigError(f"model.name timm:{model_name} takes images of one fixed size "
                          f"({made_for} px), but this recipe feeds it {sizes} px "
                          "(data.images.image_size, data.images.val_image_size, progressive "
                          "resizing): use one size, or a convolutional model")
    if sizes[0] == made_for:
        return {}
    if "img_size" in kwargs:
        raise ConfigError(f"model.kwargs.img_size={made_for} but data.images.image_size="
                          f"{sizes[0]}: timm:{model_name} takes one fixed size; make them "
                          "equal")
    return {"img_size": sizes[0]}


def build_model(name: str, num_classes: int | None, kwargs: dict | None = None,
                vocab_size: int | None = None, kind: str | None = None,
                image_sizes: tuple[int, ...] = (), pretrained: bool = False) -> nn.Module:
    """The model `name`, sized for the data: its classes, or its vocabulary for a language
    model (model.kwargs may set a larger vocabulary, never a smaller one). `kind`: the data's
    kind, whose models only it takes (None: your own data's default, or token ids where a
    vocabulary is given). `image_sizes`: every size the run
    feeds an image model (a model of fixed input size is built for it). `pretrained`: a
    library's default weights from its cache (pretrained.py)."""
    kwargs = dict(kwargs or {})
    if kind is not None or vocab_size is None:
        check_model_takes(name, kind or kinds.OWN_DATA)
    if name.startswith("hf:"):
        return huggingface.causal_lm(name[3:], kwargs, pretrained)
    if user_code.is_code_reference(name):
        return user_model(name, num_classes, kwargs, vocab_size, image_sizes)
    source, _, model_name = name.rpartition(":")
    if source == "" and model_name in BUILTIN:
        source = "hpctrain"

    def made() -> nn.Module:
        return _library_model(name, source, model_name, num_classes, kwargs, vocab_size,
                              image_sizes, pretrained)
    if not pretrained and sizing.building_for_real():  # a library's weights are its size
        try:
            with torch.device("meta"):
                on_meta = made()
        except UserError:
            raise
        except Exception:  # a model that cannot be built on the meta device: built as is
            on_meta = None
        if on_meta is not None:
            sizing.refuse_if_too_large(f"model.name {name}", on_meta)
    return made()


def _factory(made_by):
    """A model factory of hpctrain's, imported where a data kind names it by where it is
    ("package.module:function")."""
    if isinstance(made_by, str):
        module, _, function = made_by.partition(":")
        return getattr(importlib.import_module(module), function)
    return made_by


def _library_model(name: str, source: str, model_name: str, num_classes: int | None,
                   kwargs: dict, vocab_size: int | None, image_sizes: tuple[int, ...],
                   pretrained: bool) -> nn.Module:
    """A model of hpctrain's, torchvision's or timm's (see build_model)."""
    try:
        if source == "hpctrain":
            if model_name not in BUILTIN:
                raise _unknown(source, model_name, list(BUILTIN))
            factory = _factory(BUILTIN[model_name])
            facts = user_code.facts_taken(factory, {"num_classes": num_classes,
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
            if pretrained:
                return weights.load(source, model_name, num_classes, kwargs)
            return torchvision.models.get_model(model_name, weights=None,
                                                num_classes=num_classes, **kwargs)
        import timm  # timm:NAME, or a bare name that is not built in

        if not timm.is_model(model_name):
            raise _unknown("timm", model_name, timm.list_models())
        sized = _sized_for(model_name, kwargs, image_sizes)
        try:
            if pretrained:
                return split_fused_attention(weights.load("timm", model_name, num_classes,
                                                          {**kwargs, **sized}))
            return split_fused_attention(timm.create_model(
                model_name, pretrained=False, num_classes=num_classes, **kwargs, **sized))
        except (TypeError, ValueError, AssertionError, RuntimeError) as err:
            if not sized:
                raise
            raise ConfigError(f"model.name {name} takes images of one fixed size and "
                              f"cannot be built for {sized['img_size']} px ({err}); set "
                              f"data.images.image_size to the size it was made for") from None
    except (TypeError, ValueError) as err:  # a bad entry in model.kwargs
        raise ConfigError(f"model.kwargs {kwargs} do not fit {name}: {err}") from None
