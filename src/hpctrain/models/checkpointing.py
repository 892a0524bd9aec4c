"""Activation checkpointing of a model's repeated blocks.

Only the blocks' inputs are kept in the forward pass; their insides are recomputed in the
backward pass, trading about a third more compute for most of the activation memory. timm
models do it themselves (`set_grad_checkpointing`); for the others we wrap each block, found by
type, with torch's non-reentrant checkpoint wrapper (state_dict keys stay unchanged).
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

from hpctrain.errors import ConfigError

BLOCK_TYPES = {
    "BasicBlock", "Bottleneck",               # torchvision ResNets
    "ResidualBlock", "Block",                 # hpctrain built-ins (Block: the GPT's)
    "EncoderBlock",                           # torchvision ViT
    "InvertedResidual", "MBConv", "FusedMBConv", "CNBlock",  # MobileNet, EfficientNet, ConvNeXt
    "TransformerEncoderLayer", "TransformerDecoderLayer",    # torch.nn transformers
}


def is_block(module: nn.Module) -> bool:
    return type(module).__name__ in BLOCK_TYPES


def enable_activation_checkpointing(model: nn.Module, model_name: str) -> nn.Module:
    if hasattr(model, "set_grad_checkpointing"):  # timm
        model.set_grad_checkpointing(True)
        return model
    if not any(is_block(m) for m in model.modules()):
        raise ConfigError(f"model.activation_checkpointing: {model_name} has no block of a "
                          f"known type ({', '.join(sorted(BLOCK_TYPES))}) to checkpoint; "
                          "set model.activation_checkpointing=false")
    wrapper = partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=is_block)
    return model
