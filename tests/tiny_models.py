"""A tiny GPT-2 as the Hugging Face hub serves it, for the pretrained-weights tests."""

from pathlib import Path

import torch


def _tiny_gpt2(folder: Path) -> dict:
    """A two-layer GPT-2 of a 300-token vocabulary, saved as transformers saves it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(2)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2,
                                       n_head=2))
    model.save_pretrained(folder)
    return {k: v.clone() for k, v in model.state_dict().items()}
