"""hpctrain's language-model step against a hand-written nanoGPT-style loop doing the same work.

Same model and initial weights (the built-in GPT), the same blocks of tokens already in memory,
batch, precision, AdamW and warm-up + cosine schedule; the two alternate round by round (ABBA)
so machine noise hits both. Target (issue 17): time ratio <= 1.03 (hpctrain at most 3 %
slower). hpctrain's step also counts token accuracy on the device every step, which the
reference does not.

    python benchmarks/lm_overhead.py                                   # CPU: tiny-lm's GPT
    python benchmarks/lm_overhead.py --model hpctrain:gpt_124m --seq-len 1024 \
        --batch-size 16 --precision bf16 --compile true                # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import math
import tempfile
import time

import torch
import torch.nn.functional as F

from harness import alternate, print_ratios, recipe_parts, time_hpctrain, with_batches

VOCAB = 257  # the byte-level vocabulary of the built-in corpus


def token_blocks(count: int, batch_size: int, seq_len: int) -> list[torch.Tensor]:
    """Blocks of seq_len + 1 ids, as the blocks loader delivers them."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (batch_size, seq_len + 1), generator=generator)
            for _ in range(count)]


def hand_written_loop(model, batches, steps, lr, precision, device, warmup) -> float:
    """nanoGPT's train.py step, reduced to what the comparison needs: the reference."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98),
                                  weight_decay=0.01, fused=device.type == "cuda" or None)
    schedule = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    start = time.perf_counter()
    for step in range(steps):
        ids = batches[step % len(batches)].to(device, non_blocking=True)
        inputs, targets = ids[:, :-1], ids[:, 1:]
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()  # one read-back at the end, as hpctrain reads back at logging intervals
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hpctrain:gpt_tiny")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--compile", default="false")
    parser.add_argument("--steps", type=int, default=30, help="steps per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--cache-dir", help="where the built-in corpus is generated")
    args = parser.parse_args()

    overrides = [f"model.name={args.model}", f"data.tokens.seq_len={args.seq_len}",
                 f"train.batch_size={args.batch_size}", f"precision={args.precision}",
                 f"compile={args.compile}", "train.log_every=20",
                 # about ten tokens a problem: enough held-out ones for one block
                 "data.arithmetic.num_train=2000",
                 f"data.arithmetic.num_val={max(20, (args.seq_len + 1) // 4)}"]
    if args.cache_dir:
        overrides.append(f"data.arithmetic.cache_dir={args.cache_dir}")
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        parts = recipe_parts("tiny-lm", overrides, tmp)
        batches = token_blocks(8, args.batch_size, args.seq_len)
        if parts.device.type == "cuda":
            batches = [b.pin_memory() for b in batches]
        parts = with_batches(parts, batches)
        hand_model = copy.deepcopy(parts.model)
        if parts.plan.compile:
            hand_model = torch.compile(hand_model)
        lr, precision, device = parts.effective_lr, parts.plan.precision, parts.device
        warmup = max(1, args.steps // 10)
        time_hpctrain(parts, 3)  # warm-up (and compilation), both sides
        hand_written_loop(hand_model, batches, 3, lr, precision, device, warmup)
        hand, ours = alternate(
            args.rounds,
            lambda: hand_written_loop(hand_model, batches, args.steps, lr, precision, device,
                                      warmup),
            lambda: time_hpctrain(parts, args.steps))
    tokens = args.batch_size * args.seq_len
    print(f"lm_overhead: {args.model}, {args.seq_len} tokens x batch {args.batch_size}, "
          f"{precision}, compile {parts.plan.compile}, device {parts.plan.device_name}, "
          f"{args.rounds} rounds x {args.steps} steps")
    print_ratios([("hand-written nanoGPT", hand), ("hpctrain", ours)], "tokens", tokens,
                 decimals=2)


if __name__ == "__main__":
    main()
