"""Padding waste of variable-length batches: pad to the dataset's longest, random batches each
padded to their own longest, and hpctrain's length-bucketed batches; plus the DataLoader's
tokens/s for the last two. Lengths are log-normal (median 120 tokens, long tail up to 2048),
like sentences or documents. Run:  python benchmarks/sequence_padding.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

from hpctrain.data.sequences import LengthBucketSampler, TokenDataset, pad_collate, write_tokens


def tokens_per_second(dataset, sampler, workers: int) -> float:
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate,
                        num_workers=workers)
    started, real = time.perf_counter(), 0
    for batch in loader:
        real += int(batch["lengths"].sum())
    return real / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(120), 0.8, args.sequences), 4, 2048).astype(int)
    with tempfile.TemporaryDirectory() as folder:
        write_tokens(Path(folder), (rng.integers(0, 32000, n) for n in lengths),
                     np.zeros(len(lengths), int))
        dataset = TokenDataset(folder)
        random_batches = LengthBucketSampler(lengths, args.batch, pool_batches=1)
        bucketed = LengthBucketSampler(lengths, args.batch)
        to_max = 1 - lengths.sum() / (lengths.max() * len(lengths))
        rows = [("pad to the dataset's longest", to_max, None),
                ("random batches, padded per batch", random_batches.padding_fraction(),
                 tokens_per_second(dataset, random_batches, args.workers)),
                ("length-bucketed (hpctrain)", bucketed.padding_fraction(),
                 tokens_per_second(dataset, bucketed, args.workers))]
    print(f"sequence_padding: {args.sequences} sequences, median {int(np.median(lengths))} "
          f"tokens, max {lengths.max()}; batch {args.batch}, {args.workers} workers")
    print(f"{'batching':<36}{'padding':>9}{'real tok/s':>12}{'compute/real':>14}")
    for name, padding, rate in rows:
        speed = f"{rate:>12,.0f}" if rate else f"{'':>12}"
        print(f"{name:<36}{padding:>9.1%}{speed}{1 / (1 - padding):>14.2f}")


if __name__ == "__main__":
    main()
