"""Hugging Face `transformers` causal language models, built from a local config.

`model.name: hf:PATH`, where PATH is a folder holding `config.json` (as saved by
`AutoConfig.save_pretrained`, or downloaded once on a login node) or that file itself. The
model starts from random initialisation: nothing is downloaded (compute nodes have no
internet), and `model.kwargs` change the config's fields (`n_layer: 2`, ...). The model is
wrapped to take token ids and return logits, as the built-in GPT does, so the language-model
task, checkpoints and every verb treat both alike. `pip install "hpctrain[hf]"`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from hpctrain.errors import ConfigError

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
        (train/mfu.py); None where the config names them otherwise."""
        config = self.model.config
        found = [next((getattr(config, f) for f in fields if getattr(config, f, None)), None)
                 for fields in (("num_hidden_layers", "n_layer"),
                                ("num_attention_heads", "n_head"), ("hidden_size", "n_embd"))]
        if None in found:
            return None
        layers, heads, width = found
        return layers, heads, getattr(config, "head_dim", None) or width // heads


def causal_lm(path: str, kwargs: dict) -> CausalLM:
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ConfigError(f"model.name hf:{path} needs the transformers package: "
                          'pip install "hpctrain[hf]"') from None
    where = Path(path).expanduser()
    folder = where.parent if where.name == "config.json" else where
    if not (folder / "config.json").is_file():
        raise ConfigError(f"model.name hf:{path}: no config.json there; give a folder with a "
                          "model's config.json (models start from random weights, nothing is "
                          "downloaded)")
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"model.name hf:{path}: {folder / 'config.json'} is not a config "
                          f"transformers can read ({err})") from None
    for key, value in kwargs.items():
        if not hasattr(config, key):
            raise ConfigError(f"model.kwargs.{key}: the {config.model_type} config has no "
                              f"field {key!r}")
        setattr(config, key, value)
    try:
        return CausalLM(AutoModelForCausalLM.from_config(config))
    except ValueError as err:  # a config of a model that is not a causal LM (BERT, ...)
        raise ConfigError(f"model.name hf:{path}: {config.model_type} is not a causal "
                          f"language model transformers can build ({err})") from None
