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

import torch
from torch import nn

from harness import hpctrain_parts, make_batches, median_ms, time_hpctrain, with_batches


def hand_written_loop(model, batches, steps, lr, precision, device, channels_last) -> float:
    """The loop a careful user writes by hand: the reference."""
    import time

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
        images = images.to(device, non_blocking=True).float().sub_(mean).div_(std)
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
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    overrides = [f"model.name={args.model}", f"data.image_size={args.image_size}",
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
        ours, hand = [], []
        for _ in range(args.rounds):
            hand.append(hand_written_loop(hand_model, batches, args.steps, 0.2,
                                          parts.plan.precision, parts.device, channels_last))
            ours.append(time_hpctrain(parts, args.steps))
    h, o = median_ms(hand), median_ms(ours)
    images = args.batch_size
    print(f"engine_overhead: {args.model}, {args.image_size} px, batch {args.batch_size}, "
          f"{parts.plan.precision}, device {parts.plan.device_name}, "
          f"{args.rounds} rounds x {args.steps} steps, median")
    print(f"{'loop':<22}{'ms/step':>10}{'img/s':>10}{'ratio':>8}")
    print(f"{'hand-written PyTorch':<22}{h:>10.1f}{images / h * 1e3:>10.0f}{1.0:>8.3f}")
    print(f"{'hpctrain':<22}{o:>10.1f}{images / o * 1e3:>10.0f}{o / h:>8.3f}")


if __name__ == "__main__":
    main()
