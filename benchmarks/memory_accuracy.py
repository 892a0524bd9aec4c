"""hpctrain memory's prediction against measurement, for a zoo of models.

For each of resnet18, resnet50, ViT-S/16 and a GPT-style transformer, at two batch sizes, in
fp32 and bf16, with and without activation checkpointing: the prediction (fake tensors, no
memory) beside the measurement of the same step on real tensors.

- on the CPU (default): what the step holds when forward ends (parameters, optimiser states,
  autograd's saved tensors) and its peak, by the CPU allocator's own account (torch.profiler's
  memory records; hpctrain.memory.measure.allocator_step), not the storage tracker that makes
  the prediction;
- on a GPU (--device cuda): torch.cuda.max_memory_allocated against the predicted peak.

    python benchmarks/memory_accuracy.py               # the CPU table (a few minutes)
    python benchmarks/memory_accuracy.py --device cuda --scale 4
    python benchmarks/memory_accuracy.py --predict-only --scale 32   # no device needed
"""

from __future__ import annotations

import argparse
import time

from hpctrain.profiling.kineto_log import quiet_without_gpu

quiet_without_gpu()  # before torch loads: the allocator's records come from its profiler

import timm  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from hpctrain.memory.measure import allocator_step  # noqa: E402
from hpctrain.memory.simulate import StepSpec, run_steps, simulate  # noqa: E402
from hpctrain.units import fmt_bytes  # noqa: E402
from hpctrain.models.checkpointing import enable_activation_checkpointing  # noqa: E402


class Gpt(nn.Module):
    """GPT-style: token and position embeddings, pre-norm causal layers, tied LM head."""

    def __init__(self, vocab=8192, context=256, width=384, heads=6, layers=6,
                 recompute=False):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.1, activation="gelu", batch_first=True,
            norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        self.recompute = recompute

    def forward(self, ids):
        s = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(s, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(s, device=ids.device)
        for layer in self.layers:
            run = lambda t, layer=layer: layer(t, src_mask=mask, is_causal=True)
            x = checkpoint(run, x, use_reentrant=False) if self.recompute else run(x)
        return self.head(self.norm(x)).flatten(0, 1)


def image_model(build, size: int):
    def make(batch, device):
        return (torch.randn(batch, 3, size, size, device=device),
                torch.randint(0, 1000, (batch,), device=device))
    return build, make


def zoo(scale: int, image_size: int | None = None):
    """name: (build(ac), input size or batch maker, base batch); `image_size` replaces the
    image models' 128 and 224 (a smaller one for a quick check)."""
    context = 256

    def gpt_batch(batch, device):
        ids = torch.randint(0, 8192, (batch, context), device=device)
        return ids, torch.randint(0, 8192, (batch * context,), device=device)

    return {
        "resnet18": (lambda ac: _ckpt(torchvision.models.resnet18(), ac), image_size or 128,
                     8 * scale),
        "resnet50": (lambda ac: _ckpt(torchvision.models.resnet50(), ac), image_size or 128,
                     4 * scale),
        "vit_small": (lambda ac: _ckpt(timm.create_model(
            "vit_small_patch16_224", img_size=image_size or 224), ac), image_size or 224,
            4 * scale),
        "gpt": (lambda ac: Gpt(recompute=ac), gpt_batch, 4 * scale),
    }


def _ckpt(model, on):
    return enable_activation_checkpointing(model, "zoo") if on else model


def spec_for(build, input_or_size, precision, ac, target):
    make = input_or_size if callable(input_or_size) else image_model(None, input_or_size)[1]
    return StepSpec(lambda: build(ac), make,
                    lambda m: torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True),
                    nn.CrossEntropyLoss(), precision, target)


def held(split):
    return sum(v for k, v in split.items() if k != "temporaries")


def measure_gpu(spec, batch):
    model = spec.build_model().cuda()
    optimizer = spec.build_optimizer(model)
    torch.cuda.reset_peak_memory_stats()
    run_steps(spec, model, optimizer, batch, torch.device("cuda"), steps=3)
    peak = torch.cuda.max_memory_allocated()
    del model, optimizer
    torch.cuda.empty_cache()
    return peak


def states_only(spec) -> int:
    """What the field's estimators give (accelerate estimate-memory, DeepSpeed's model-state
    estimator): weights, gradients and Adam's two moments at 4 bytes each, no activations."""
    with torch.device("meta"):
        model = spec.build_model()
    return 16 * sum(p.numel() for p in model.parameters())


def predict_only(args) -> None:
    print("| model | batch | precision | ckpt | hpctrain predicted peak (GPU) | states only "
          "| states only / predicted |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        build, data, base = zoo(args.scale, args.image_size)[name]
        for precision in args.precisions:
            for ac in args.checkpointing:
                spec = spec_for(build, data, precision, ac, "cuda")
                predicted, baseline = simulate(spec, base).peak, states_only(spec)
                print(f"| {name} | {base} | {precision} | {'yes' if ac else 'no'} | "
                      f"{fmt_bytes(predicted)} | {fmt_bytes(baseline)} | "
                      f"{baseline / predicted:.2f} |", flush=True)


def _listed(words: dict):
    """An argument type: comma-separated keys of `words`, read as their values."""
    def parse(text: str) -> list:
        if any(word not in words for word in text.split(",")):
            raise argparse.ArgumentTypeError(f"{text!r}: comma-separated words of "
                                             f"{', '.join(words)}")
        return [words[word] for word in text.split(",")]
    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--scale", type=int, default=1, help="multiply the batch sizes")
    parser.add_argument("--models", default="resnet18,resnet50,vit_small,gpt")
    parser.add_argument("--image-size", type=int, default=None,
                        help="the image models' side (default 128, ViT 224)")
    parser.add_argument("--precisions", type=_listed({"fp32": "fp32", "bf16": "bf16"}),
                        default="fp32,bf16",
                        help="the precisions measured: fp32, bf16 or both (comma-separated)")
    parser.add_argument("--checkpointing", type=_listed({"no": False, "yes": True}),
                        default="no,yes",
                        help="activation checkpointing off (no), on (yes) or both")
    parser.add_argument("--predict-only", action="store_true",
                        help="the GPU prediction beside the states-only estimate, measuring "
                             "nothing (for batch sizes this machine cannot run)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.predict_only:
        predict_only(args)
        return
    worst, cases = 0.0, 0
    what = "torch.cuda.max_memory_allocated" if args.device == "cuda" else \
        "the CPU allocator's peak (torch.profiler's memory records)"
    print(f"measured: {what}; ratios are estimate / measured (1.00 is exact)\n")
    header = ("| model | batch | precision | ckpt | measured peak | hpctrain | ratio | "
              "states only | ratio |" + (" held after forward: ratio |"
                                          if args.device == "cpu" else ""))
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name in args.models.split(","):
        build, data, base = zoo(args.scale, args.image_size)[name]
        for batch in (base, 2 * base):
            for precision in args.precisions:
                for ac in args.checkpointing:
                    spec = spec_for(build, data, precision, ac, args.device)
                    started = time.perf_counter()
                    predicted = simulate(spec, batch)
                    baseline = states_only(spec)
                    extra = ""
                    if args.device == "cuda":
                        peak = measure_gpu(spec, batch)
                    else:
                        after_forward, peak, _ = allocator_step(spec, batch, steps=2)
                        held_ratio = held(predicted.end_of_forward) / after_forward
                        extra = f" {held_ratio:.3f} |"
                        worst = max(worst, abs(held_ratio - 1))
                    ratio = predicted.peak / peak
                    worst, cases = max(worst, abs(ratio - 1)), cases + 1
                    print(f"| {name} | {batch} | {precision} | {'yes' if ac else 'no'} | "
                          f"{fmt_bytes(peak)} | {fmt_bytes(predicted.peak)} | {ratio:.3f} | "
                          f"{fmt_bytes(baseline)} | {baseline / peak:.2f} |{extra}"
                          f"  ({time.perf_counter() - started:.0f} s)", flush=True)
    print(f"\nworst relative error of hpctrain: {worst:.1%} over {cases} cases (target: 10%)")


if __name__ == "__main__":
    main()
