"""Hugging Face `transformers` causal language models, built from a local config.

`model.name: hf:PATH`, where PATH is a folder holding `config.json` (as saved by
`AutoConfig.save_pretrained`, or downloaded once on a login node) or that file itself, or a
hub name (`hf:openai-community/gpt2`) whose files `hpctrain prefetch` put in the Hugging Face
cache. The model starts from random initialisation, or with model.pretrained from the weights
beside its config: nothing is downloaded (compute nodes have no internet), and `model.kwargs`
change the config's fields (`n_layer: 2`, ...). The model is
wrapped to take token ids and return logits, as the built-in GPT does, so the language-model
task, checkpoints and every verb treat both alike. `pip install "hpctrain[hf]"`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.models import download, sizing, weight_files
from hpctrain.models.pretrained import PREFETCH, hub_cache
from hpctrain.readers import MiB, json_document

CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")


class CausalLM(nn.Module):
    """Token ids in, logits out; `vocab_size` and `context` for the checks before training."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        config = model.config
        self.vocab_size = config.vocab_size
        self.context = next((getattr(config, f) for f in CONTEXT_FIELDS
                             if getattr(config, f, None)), None)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, use_cache=False).logits

    def attention_shape(self) -> tuple[int, int, int] | None:
        """(layers, heads, head dimension) from the config, for the model FLOPs
        (train/hardware/mfu.py); None where the config names them otherwise."""
        config = self.model.config
        found = [next((getattr(config, f) for f in fields if getattr(config, f, None)), None)
                 for fields in (("num_hidden_layers", "n_layer"),
                                ("num_attention_heads", "n_head"), ("hidden_size", "n_embd"))]
        if None in found:
            return None
        layers, heads, width = found
        return layers, heads, getattr(config, "head_dim", None) or width // heads


def causal_lm(path: str, kwargs: dict, pretrained: bool = False) -> CausalLM:
    """The causal LM of a local folder (or its config.json), else of a hub name in the
    Hugging Face cache; random weights from its config, or with `pretrained` its weights.
    Nothing is downloaded: `hpctrain prefetch` fills the cache (models/pretrained.py)."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ConfigError(f"model.name hf:{path} needs the transformers package: "
                          'pip install "hpctrain[hf]"') from None
    config, folder = _config(path, kwargs)
    source = str(folder) if folder else path
    found = {"local_files_only": True, **({} if folder else {"cache_dir": hub_cache()})}
    _fits_here(path, config)
    if not pretrained:
        try:
            return CausalLM(AutoModelForCausalLM.from_config(config))
        except ValueError as err:  # a config of a model that is not a causal LM (BERT, ...)
            raise _not_causal(path, config, err) from None
    try:
        with weight_files.tensors_only():
            return CausalLM(AutoModelForCausalLM.from_pretrained(source, config=config,
                                                                 **found))
    except OSError as err:  # the weights are not there
        raise ConfigError(f"model.pretrained: hf:{path} has a config but no weights "
                          f"transformers can read ({str(err).splitlines()[0][:200]}); fetch "
                          f"them with {PREFETCH}") from None
    except ValueError as err:
        if "Unrecognized configuration class" in str(err):  # BERT, ...
            raise _not_causal(path, config, err) from None
        raise _damaged(path, folder, err) from None
    except weight_files.UNREADABLE as err:  # a pickle that is not only tensors, a bad header
        raise _damaged(path, folder, err) from None


CONFIG_CAP = 16 * MiB  # a config.json (GPT-2's: 665 bytes)


def _not_finite(value, where: str = "") -> tuple[str, float] | None:
    """(the dotted path, the value) of the first field of a JSON value that is NaN or
    infinite (JSON has neither; Python's reader takes both); None where there is none."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the value", value
    children = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found = _not_finite(child, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _strict_errors() -> tuple[type, ...]:
    """huggingface_hub's refusal of a field of the wrong type (newer versions), a config
    fault like the others."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _config(path: str, kwargs: dict):
    """The model's config (model.kwargs applied, each of the type of the field it changes)
    and its local folder (None: a hub name in the cache). config.json is read within the
    limits of readers.py first: transformers' own reading of one nested 200,000 deep is a
    RecursionError."""
    from transformers import AutoConfig

    where = Path(path).expanduser()
    folder = where.parent if where.name == "config.json" else where
    local = (folder / "config.json").is_file()
    config_file = folder / "config.json" if local else _cached_config(path)
    if config_file is None:
        raise ConfigError(f"model.name hf:{path}: no config.json there, and no model {path} "
                          f"in the Hugging Face cache ({hub_cache()}); give a folder with a "
                          f"model's config.json, or fetch the model with {PREFETCH}")
    # the hub cache's snapshot names are links to its blobs: read where they lead
    document, unreadable = json_document(config_file.resolve(), CONFIG_CAP)
    try:
        if unreadable:
            raise ValueError(f"{config_file.name} {unreadable}")
        if (found := _not_finite(document)) is not None:
            raise ValueError(f"{found[0]} is {found[1]}: a config's numbers are finite")
        config = AutoConfig.from_pretrained(
            str(folder) if local else path, local_files_only=True,
            **({} if local else {"cache_dir": hub_cache()}))
    except (OSError, ValueError, KeyError, TypeError, *_strict_errors()) as err:
        raise ConfigError(f"model.name hf:{path}: its config.json is not a config "
                          f"transformers can read ({str(err).splitlines()[0][:300]})") from None
    for key, value in kwargs.items():
        if not hasattr(config, key):
            raise ConfigError(f"model.kwargs.{key}: the {config.model_type} config has no "
                              f"field {key!r}")
        now = getattr(config, key)
        if isinstance(now, int) and not isinstance(now, bool) and \
                (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"model.kwargs.{key} = {str(value)[:40]}: the "
                              f"{config.model_type} config's {key} is a whole number "
                              f"({now})")
        setattr(config, key, value)
    return config, folder if local else None


def _fits_here(path: str, config) -> None:
    """Counted on the meta device before it is built in host memory (sizing.py), also with
    its weights: its config says its size (vocab_size 10^11 was an allocation traceback)."""
    from transformers import AutoModelForCausalLM

    if sizing.building_for_real():
        with torch.device("meta"):
            sizing.refuse_if_too_large(f"model.name hf:{path}",
                                       AutoModelForCausalLM.from_config(config))


def _not_causal(path: str, config, err: Exception) -> ConfigError:
    return ConfigError(f"model.name hf:{path}: {config.model_type} is not a causal language "
                       f"model transformers can build ({err})")


def _damaged(path: str, folder: Path | None, err: Exception) -> ConfigError:
    weights = f"the weights in {folder}" if folder else \
        f"the weights of hf:{path} in the Hugging Face cache ({hub_cache()})"
    return weight_files.refused("model.pretrained", weights, err, "replace them with weights "
                                f"you trust, or fetch them again with {PREFETCH}")


def _cached_config(name: str) -> Path | None:
    """The cached config.json of `name`, a hub name (ORG/NAME); None when not cached."""
    from huggingface_hub import try_to_load_from_cache

    if not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return None  # a path that does not exist
    found = try_to_load_from_cache(name, "config.json", cache_dir=hub_cache())
    return Path(found) if isinstance(found, str) else None


HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "tokenizer*"]  # what prefetch gets


def prefetch(name: str, patience: download.Patience = download.Patience()) -> Path:
    """A hub model's config, weights and tokenizer files into the Hugging Face cache, each
    checked as it streams (download.py); the snapshot folder."""
    from huggingface_hub import constants

    # the endpoint as now set (HF_ENDPOINT: a mirror), where the library formed its URLs at import
    return download.hub_files(name, hub_cache(), constants.ENDPOINT, HUB_FILES, patience)
