"""Training throughput and MFU on synthetic data, one row per system switch.

Images (ResNet-50): fp32, tf32, bf16, bf16 + channels_last, bf16 + channels_last + compile.
The A100 reference is NVIDIA's 2,470 img/s (AMP, DALI); the goal on an H100 is >= 3,000 img/s.
Transformer (hpctrain:gpt_1b, 2,048 tokens): bf16 against fp8 with tensorwise and rowwise
scaling, all compiled, as a ratio to bf16.
All through hpctrain's real training step with the batches already in pinned memory. MFU
divides by the node's measured peak (`hpctrain bench node`) where one is kept, else the spec
sheet's; the transformer rows all divide by the bf16 peak, so their MFU compares as speed.

    python benchmarks/gpu_throughput.py                     # on a GPU node
    python benchmarks/gpu_throughput.py --device cpu --image-size 64 --batch-size 8 --steps 2
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from harness import hpctrain_parts, make_batches, recipe_parts, time_hpctrain, with_batches

from hpctrain.errors import UserError
from hpctrain.train.hardware.mfu import measured_flops, peak_flops

RESNET50_TRAIN_FLOP_224 = 3 * 8.2e9  # forward 4.1 GMACs; a training step is about 3x forward

ROWS = [
    ("fp32", ["precision=fp32", "channels_last=false", "compile=false"]),
    ("tf32", ["precision=tf32", "channels_last=false", "compile=false"]),
    ("bf16", ["precision=bf16", "channels_last=false", "compile=false"]),
    ("bf16 + channels_last", ["precision=bf16", "channels_last=true", "compile=false"]),
    ("bf16 + channels_last + compile", ["precision=bf16", "channels_last=true",
                                        "compile=true"]),
]


TRANSFORMER_ROWS = [
    ("bf16 + compile", ["precision=bf16", "compile=true"]),
    ("fp8 tensorwise + compile", ["precision=fp8", "fp8.scaling=tensorwise", "compile=true"]),
    ("fp8 rowwise + compile", ["precision=fp8", "fp8.scaling=rowwise", "compile=true"]),
]


def peak_for(device_name: str, precision: str) -> tuple[float | None, str]:
    """The peak FLOP/s an MFU divides by, and where it came from."""
    name = "bf16" if precision in ("bf16", "fp16", "fp8") else precision
    if measured := measured_flops(device_name, name):
        return measured, f"measured {name}"
    return peak_flops(device_name, name), f"spec {name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--table", choices=("all", "images", "transformer"), default="all")
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--rows", default="all", help="comma-separated row numbers (1-5)")
    parser.add_argument("--gpt", default="1b", help="hpctrain:gpt_<size> for the transformer")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--gpt-batch-size", type=int, default=8)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: no CUDA device here: not measured")
        return
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"gpu_throughput: {name}, torch {torch.__version__}, {args.steps} steps after "
          f"{args.warmup} warm-up")
    with tempfile.TemporaryDirectory() as tmp:
        if args.table in ("all", "images"):
            images(args, tmp)
        if args.table in ("all", "transformer"):
            transformer(args, tmp)


def _timed(parts, args) -> float:
    """Seconds per step after the warm-up (cudnn autotuning, compilation)."""
    time_hpctrain(parts, args.warmup)
    seconds = time_hpctrain(parts, args.steps)
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return seconds


def images(args, tmp: str) -> None:
    chosen = ROWS if args.rows == "all" else [ROWS[int(i) - 1] for i in args.rows.split(",")]
    flop_per_image = RESNET50_TRAIN_FLOP_224 * (args.image_size / 224) ** 2
    batches = make_batches(4, args.batch_size, args.image_size, 1000,
                           pin=args.device.startswith("cuda"))
    print(f"\n{args.model}, {args.image_size} px, batch {args.batch_size}")
    print(f"{'row':<34}{'img/s':>10}{'MFU':>8}{'vs fp32':>9}{'vs A100 AMP':>13}  peak")
    base = None
    for label, overrides in chosen:  # each row printed as it is measured: compiling takes long
        parts = hpctrain_parts([f"device={args.device}", f"model.name={args.model}",
                                f"data.images.image_size={args.image_size}",
                                f"train.batch_size={args.batch_size}", "train.log_every=25",
                                "data.synthetic.num_classes=1000", *overrides], tmp)
        rate = args.batch_size / _timed(with_batches(parts, batches), args)
        peak, source = peak_for(parts.plan.device_name, parts.plan.precision)
        del parts
        base = base or rate
        mfu = f"{rate * flop_per_image / peak:.1%}" if peak else "n/a"
        print(f"{label:<34}{rate:>10.0f}{mfu:>8}{rate / base:>9.2f}{rate / 2470:>13.2f}"
              f"  {source}", flush=True)


def transformer(args, tmp: str) -> None:
    """A GPT on random token blocks: tokens/s and MFU (6 x parameters per token)."""
    shape = [f"model.name=hpctrain:gpt_{args.gpt}", f"data.tokens.seq_len={args.seq_len}",
             f"train.batch_size={args.gpt_batch_size}", f"device={args.device}",
             "train.log_every=25"]
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (args.gpt_batch_size, args.seq_len + 1),
                             generator=generator) for _ in range(4)]
    if args.device.startswith("cuda"):
        batches = [b.pin_memory() for b in batches]
    tokens = args.gpt_batch_size * args.seq_len
    print(f"\nhpctrain:gpt_{args.gpt}, {args.seq_len} tokens, batch {args.gpt_batch_size}")
    print(f"{'row':<34}{'tokens/s':>10}{'MFU':>8}{'vs bf16':>9}  peak")
    base = None
    for label, overrides in TRANSFORMER_ROWS:
        try:
            parts = recipe_parts("tiny-lm", [*shape, *overrides], tmp)
        except UserError as err:  # fp8 without FP8 hardware: said, not measured
            print(f"{label:<34}{'-':>10}{'-':>8}{'-':>9}  not measured: "
                  f"{str(err).split(';')[0]}", flush=True)
            continue
        rate = tokens / _timed(with_batches(parts, batches), args)
        peak, source = peak_for(parts.plan.device_name, "bf16")
        mfu = f"{parts.model_flops.per_token(args.seq_len) * rate / peak:.1%}" if peak else "n/a"
        del parts
        base = base or rate
        print(f"{label:<34}{rate:>10.0f}{mfu:>8}{rate / base:>9.2f}  {source}", flush=True)


if __name__ == "__main__":
    main()
