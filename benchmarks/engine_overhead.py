"""hpctrain's training step against a minimal hand-written PyTorch loop doing the same work.

Same model and initial weights, batch, precision, optimiser and schedule, data already in
memory; the two alternate round by round so machine noise hits both. Target: ratio <= 1.03.

    python benchmarks/engine_overhead.py                      # CPU: resnet_small, 32 px
    python benchmarks/engine_overhead.py --model torchvision:resnet50 --image-size 224 \
        --batch-size 256 --precision bf16                     # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time

import torch
from torch import nn

from harness import (alternate, hpctrain_parts, make_batches, median_ms, time_hpctrain,
                     with_batches)


def hand_written_loop(model, batches, steps, lr, precision, device, channels_last) -> float:
    """The loop a careful user writes by hand: the reference."""
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                                weight_decay=5e-4, foreach=device.type != "cuda",
                                fused=device.type == "cuda" or None)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps + 1)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    start = time.perf_counter()
    for step in range(steps):
        images, labels = batches[step % len(batches)]
        images = images.to(device, non_blocking=True).permute(0, 3, 1, 2)  # NHWC uint8 in
        images = images.float().sub_(mean).div_(std)
        images = images.contiguous(memory_format=memory_format)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(images), labels, label_smoothing=0.1)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()  # one read-back at the end, as hpctrain reads back at logging intervals
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hpctrain:resnet_small")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--channels-last", default="false")
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--verbose", action="store_true", help="print every round")
    args = parser.parse_args()

    overrides = [f"model.name={args.model}", f"data.images.image_size={args.image_size}",
                 f"train.batch_size={args.batch_size}", f"precision={args.precision}",
                 f"channels_last={args.channels_last}", "compile=false",
                 "data.synthetic.num_classes=10", "train.log_every=20"]
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        parts = hpctrain_parts(overrides, tmp)
        batches = make_batches(8, args.batch_size, args.image_size, 10,
                               pin=parts.device.type == "cuda")
        parts = with_batches(parts, batches)
        hand_model = copy.deepcopy(parts.model)
        channels_last = parts.plan.channels_last
        time_hpctrain(parts, 3)  # warm-up, both sides
        hand_written_loop(hand_model, batches, 3, 0.2, parts.plan.precision, parts.device,
                          channels_last)
        hand, ours = alternate(
            args.rounds,
            lambda: hand_written_loop(hand_model, batches, args.steps, 0.2,
                                      parts.plan.precision, parts.device, channels_last),
            lambda: time_hpctrain(parts, args.steps))
    if args.verbose:
        print("hand", [round(x * 1e3, 1) for x in hand])
        print("ours", [round(x * 1e3, 1) for x in ours])
    print(f"engine_overhead: {args.model}, {args.image_size} px, batch {args.batch_size}, "
          f"{parts.plan.precision}, device {parts.plan.device_name}, "
          f"{args.rounds} rounds x {args.steps} steps")
    print(f"{'loop':<22}{'median ms/step':>16}{'img/s':>8}{'ratio':>8}"
          f"{'best ms/step':>14}{'ratio':>8}")
    for label, samples in (("hand-written PyTorch", hand), ("hpctrain", ours)):
        med, best = median_ms(samples), min(samples) * 1e3
        print(f"{label:<22}{med:>16.1f}{args.batch_size / med * 1e3:>8.0f}"
              f"{med / median_ms(hand):>8.3f}{best:>14.1f}{best / (min(hand) * 1e3):>8.3f}")


if __name__ == "__main__":
    main()
