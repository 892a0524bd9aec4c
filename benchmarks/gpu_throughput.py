"""ResNet-50 training throughput and MFU on synthetic data, one row per system switch.

Rows: fp32, tf32, bf16, bf16 + channels_last, bf16 + channels_last + compile, all through
hpctrain's real training step with the batches already in device-visible pinned memory.
The A100 reference is NVIDIA's 2,470 img/s (AMP, DALI); the goal on an H100 is >= 3,000 img/s.

    python benchmarks/gpu_throughput.py                     # on a GPU node
    python benchmarks/gpu_throughput.py --device cpu --image-size 64 --batch-size 8 --steps 2
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from harness import hpctrain_parts, make_batches, time_hpctrain, with_batches

RESNET50_TRAIN_FLOP_224 = 3 * 8.2e9  # forward 4.1 GMACs; a training step is about 3x forward

# Dense peaks in FLOP/s (anchors.md): tensor-core bf16/fp16, tf32, and plain fp32 (no TC).
PEAKS = {
    "H100": {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "tf32": 495e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
}

ROWS = [
    ("fp32", ["precision=fp32", "channels_last=false", "compile=false"]),
    ("tf32", ["precision=tf32", "channels_last=false", "compile=false"]),
    ("bf16", ["precision=bf16", "channels_last=false", "compile=false"]),
    ("bf16 + channels_last", ["precision=bf16", "channels_last=true", "compile=false"]),
    ("bf16 + channels_last + compile", ["precision=bf16", "channels_last=true",
                                        "compile=true"]),
]


def peak_for(device_name: str, precision: str) -> float | None:
    for key, peaks in PEAKS.items():
        if key in device_name:
            return peaks["bf16" if precision in ("bf16", "fp16") else precision]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--rows", default="all", help="comma-separated row numbers (1-5)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: no CUDA device here: not measured")
        return
    chosen = ROWS if args.rows == "all" else [ROWS[int(i) - 1] for i in args.rows.split(",")]
    flop_per_image = RESNET50_TRAIN_FLOP_224 * (args.image_size / 224) ** 2
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        batches = make_batches(4, args.batch_size, args.image_size, 1000,
                               pin=args.device.startswith("cuda"))
        for label, overrides in chosen:
            parts = hpctrain_parts([f"device={args.device}", f"model.name={args.model}",
                                    f"data.image_size={args.image_size}",
                                    f"train.batch_size={args.batch_size}", "train.log_every=25",
                                    "data.synthetic.num_classes=1000", *overrides], tmp)
            parts = with_batches(parts, batches)
            time_hpctrain(parts, args.warmup)  # cudnn autotuning, compilation
            seconds = time_hpctrain(parts, args.steps)
            rate = args.batch_size / seconds
            peak = peak_for(parts.plan.device_name, parts.plan.precision)
            mfu = rate * flop_per_image / peak if peak else None
            results.append((label, rate, mfu))
            del parts
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"gpu_throughput: {args.model}, {args.image_size} px, batch {args.batch_size}, "
          f"{args.steps} steps after {args.warmup} warm-up, {name}, torch {torch.__version__}")
    print(f"{'row':<34}{'img/s':>10}{'MFU':>8}{'vs fp32':>9}{'vs A100 AMP':>13}")
    base = results[0][1]
    for label, rate, mfu in results:
        mfu_text = f"{mfu:.1%}" if mfu is not None else "n/a"
        print(f"{label:<34}{rate:>10.0f}{mfu_text:>8}{rate / base:>9.2f}{rate / 2470:>13.2f}")


if __name__ == "__main__":
    main()
