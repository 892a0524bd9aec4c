"""Evaluation time with batch-norm folded into the convolutions (train.fuse_eval) against the
plain model, through hpctrain's real evaluation on batches held in (pinned) memory; the
accuracies must be equal and the logits within rounding.

    python benchmarks/fused_eval.py                          # ResNet-50, bf16, on a GPU node
    python benchmarks/fused_eval.py --device cpu --model torchvision:resnet18 --image-size 64
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from types import SimpleNamespace

import torch

from harness import hpctrain_parts, make_batches

from hpctrain.train.validation.evaluation import evaluate


def _seconds(parts, model, rounds: int) -> tuple[float, dict]:
    """The fastest of `rounds` evaluations over the batches, and its figures."""
    best, values = float("inf"), {}
    for _ in range(rounds):
        start = time.perf_counter()
        values = evaluate(parts, model)  # its read-back waits for the device
        best = min(best, time.perf_counter() - start)
    return best, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="both models compiled")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("fused_eval: no CUDA device here: not measured")
        return
    on_gpu = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        parts = hpctrain_parts([f"device={args.device}", f"model.name={args.model}",
                                f"data.images.image_size={args.image_size}", "train.fuse_eval=true",
                                f"train.batch_size={args.batch_size}", f"compile={args.compile}",
                                "data.synthetic.num_classes=1000"], tmp)
        batches = make_batches(args.batches, args.batch_size, args.image_size, 1000, on_gpu)
        rows = args.batches * args.batch_size
        data = dataclasses.replace(parts.data, val_loader=batches,
                                   val_sampler=SimpleNamespace(real_count=rows))
        parts = dataclasses.replace(parts, data=data)
        folded = parts.fused_eval.module()
        _seconds(parts, parts.step.model, 1)  # warm-up: cudnn autotuning, compilation
        _seconds(parts, folded, 1)
        plain, plain_values = _seconds(parts, parts.step.model, args.rounds)
        fused, fused_values = _seconds(parts, folded, args.rounds)
        x = parts.task.to_device(batches[0], False).inputs
        with torch.no_grad(), parts.step.precision.autocast():  # the modules evaluate() calls
            difference = (folded.eval()(x).float() -
                          parts.step.model.eval()(x).float()).abs().max()
    name = torch.cuda.get_device_name() if on_gpu else "cpu"
    print(f"fused_eval: {args.model}, {args.image_size} px, {rows} images in batches of "
          f"{args.batch_size}, {parts.plan.precision}, compile {args.compile}, best of "
          f"{args.rounds}, {name}, torch {torch.__version__}; {parts.fused_eval.describe()}")
    print(f"{'evaluation':<22}{'seconds':>10}{'img/s':>10}{'vs plain':>10}{'accuracy':>10}")
    for label, seconds, values in (("plain", plain, plain_values),
                                   ("conv+BN folded", fused, fused_values)):
        print(f"{label:<22}{seconds:>10.3f}{rows / seconds:>10.0f}{plain / seconds:>10.2f}"
              f"{values['val_accuracy']:>10.4f}")
    # accuracy compared exactly; the loss is a float summed in another order: its difference
    # said (comparing the whole figures made rounding in val_loss read as "DIFFER")
    loss_apart = abs(fused_values["val_loss"] - plain_values["val_loss"]) / \
        max(abs(plain_values["val_loss"]), 1e-12)
    same = plain_values["val_accuracy"] == fused_values["val_accuracy"]
    print(f"largest logit difference {difference.item():.2e}; accuracies "
          f"{'equal' if same else 'DIFFER'}; losses {loss_apart:.1e} apart (relative)")


if __name__ == "__main__":
    main()
