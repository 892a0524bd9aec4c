"""hpctrain memory's activations against Korthikanti et al. 2022's formula.

"Reducing Activation Recomputation in Large Transformer Models" (Korthikanti et al., 2022)
counts what a transformer layer keeps for backward, in bytes with 16-bit activations:
s·b·h·(34 + 5·a·s/h) per layer, divided by t with tensor and sequence parallelism (tensor
parallelism alone: s·b·h·(10 + 24/t + 5·a·s/(h·t))). With fused attention (flash, cuDNN) the
5·a·s/h term is gone, and with dropout at 0 its two dropout masks (2·s·b·h): 32/t, or 8 + 24/t.
PyTorch's layer norms run in fp32 under autocast and keep their fp32 input, which the formula
counts at 2 bytes: the "fp32 norms" column adds those 4·s·b·h (not split by tensor parallelism
alone).

For each case: the formula's activations for all layers against hpctrain's prediction per GPU
(the whole step's activations, embedding and output layer included), and the attention kernel
the prediction ran. No GPU needed: the prediction runs on fake tensors.

    python benchmarks/activation_formula.py                  # gpt_124m, gpt-1b, vit-huge
    python benchmarks/activation_formula.py --cases tiny     # the smoke test's
"""

from __future__ import annotations

import argparse
import time

import torch

from hpctrain.config import load_config
from hpctrain.memory.estimate import estimate, output_width, resolve_target, step_spec
from hpctrain.units import fmt_bytes

CASES = {  # name: (recipe, overrides)
    "gpt_124m": ("tiny-lm", ["model.name=hpctrain:gpt_124m", "data.tokens.seq_len=1024",
                             "train.batch_size=16", "precision=bf16"]),
    "gpt-1b": ("gpt-1b", []),
    "vit-huge": ("vit-huge", []),
    "vit-huge-1": ("vit-huge", ["parallel.tensor=1", "train.batch_size=64"]),
    "tiny": ("tiny-lm", ["precision=bf16", "parallel.tensor=2",
                         "parallel.sequence_parallel=true"]),
}


def shape(model: torch.nn.Module, config) -> tuple[int, int, int, int]:
    """(layers, width, heads, tokens per sample) of an hpctrain GPT or a timm ViT."""
    if hasattr(model, "attention_shape"):
        layers, heads, head_dim = model.attention_shape()
        return layers, heads * head_dim, heads, config.data.tokens.seq_len
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    return len(model.blocks), model.embed_dim, model.blocks[0].attn.num_heads, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="gpt_124m,gpt-1b,vit-huge,vit-huge-1",
                        help=f"of {', '.join(CASES)}")
    args = parser.parse_args()
    print("| case | b | s | h | a | t | SP | attention | Korthikanti (fused, no dropout) | "
          "with fp32 norms | hpctrain | ratio | ratio to fp32 norms |")
    print("|" + "---|" * 13)
    for name in args.cases.split(","):
        started = time.perf_counter()
        recipe, overrides = CASES[name]
        config = load_config(recipe, overrides)
        p = config.parallel
        target = resolve_target(config, None, p.tensor * p.pipeline)
        est = estimate(config, target)
        with torch.device("meta"):
            model = step_spec(config, target, output_width(config)[0]).build_model()
        layers, h, a, s = shape(model, config)
        b, t, sp = est.batch_size, p.tensor, p.sequence_parallel and p.tensor > 1
        per_token = 32 / t if sp else 8 + 24 / t
        formula = s * b * h * per_token * layers
        fp32_norms = s * b * h * (per_token + (4 / t if sp else 4)) * layers
        predicted = est.rows["activations"]
        kernel = next((n.split(": ", 1)[1].split(" (")[0]
                       for n in est.footprint.notes if n.startswith("attention:")), "-")
        print(f"| {name} | {b} | {s} | {h} | {a} | {t} | {'yes' if sp else 'no'} | {kernel} | "
              f"{fmt_bytes(formula)} | {fmt_bytes(fp32_norms)} | {fmt_bytes(predicted)} | "
              f"{predicted / formula:.3f} | {predicted / fp32_norms:.3f} |"
              f"  ({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
