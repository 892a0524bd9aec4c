"""Training speed of a classifier on variable-length samples: random batches padded to their
longest by the user's collate, against `data.bucketing: true` (batches of similar length).

A transformer classifier (embedding, 2 layers told the padding, masked mean, linear head)
trains through `hpctrain.fit` on sequences of log-normal length (most short, a long tail,
as sentences are), each way for the same number of epochs from the same weights. For each:
the share of padding in an epoch's batches (from the lengths, as the banner says it), the
samples/s hpctrain measured, and the final validation accuracy (bucketing changes which
samples share a batch, not what is learnt).

    python benchmarks/bucketing.py                        # 4,096 sequences, median 48
    python benchmarks/bucketing.py --median 200 --longest 1024 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import tempfile

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

import hpctrain
from hpctrain.data.loader import bucketing_note
from hpctrain.data.tokens.sequences import LengthBucketSampler

VOCAB = 64


class Sequences(Dataset):
    """Token ids of log-normal length; class 1 draws 70 % of its tokens from the lower half
    of the vocabulary, class 0 30 %. Its `lengths` spare hpctrain reading every sample."""

    def __init__(self, count: int, median: float, longest: int, seed: int):
        rng = np.random.default_rng(seed)
        self.lengths = np.clip(rng.lognormal(np.log(median), 0.8, count), 4, longest)
        self.lengths = self.lengths.astype(int).tolist()
        self.labels = rng.integers(0, 2, count).tolist()
        self.ids = [torch.from_numpy(np.where(rng.random(n) < (0.7 if label else 0.3),
                                              rng.integers(1, 32, n),
                                              rng.integers(32, VOCAB, n)))
                    for n, label in zip(self.lengths, self.labels)]

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return self.ids[index], self.labels[index]


def pad_collate(samples):
    """(inputs, labels): ids padded with 0 to the batch's longest, and their mask."""
    longest = max(len(ids) for ids, _ in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, (sample, _) in enumerate(samples):
        ids[row, :len(sample)], mask[row, :len(sample)] = sample, 1
    return {"ids": ids, "mask": mask}, torch.tensor([label for _, label in samples])


class Classifier(nn.Module):
    def __init__(self, width: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(
            width, 4, 4 * width, dropout=0.0, batch_first=True), layers,
            enable_nested_tensor=False)
        self.head = nn.Linear(width, 2)

    def forward(self, ids, mask):
        hidden = self.encoder(self.embed(ids), src_key_padding_mask=mask == 0)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * weights).sum(1) / weights.sum(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--median", type=float, default=48)
    parser.add_argument("--longest", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    train = Sequences(args.samples, args.median, args.longest, 0)
    val = Sequences(max(args.samples // 8, args.batch_size), args.median, args.longest, 1)
    torch.manual_seed(0)
    model = Classifier(args.width, args.layers)
    sampler = LengthBucketSampler(train.lengths, args.batch_size)
    print(f"{args.samples} sequences of median {args.median:.0f} tokens (up to "
          f"{max(train.lengths)}), batch {args.batch_size}, {args.epochs} epochs on "
          f"{args.device}; {bucketing_note(sampler)}")
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for name, bucketing in (("random batches", False), ("data.bucketing", True)):
            summary = hpctrain.fit(
                copy.deepcopy(model), train, val, collate_fn=pad_collate, output_dir=out,
                run_name=name.replace(" ", "-").replace(".", "-"), device=args.device,
                data={"num_workers": 0, "bucketing": bucketing},
                train={"epochs": args.epochs, "batch_size": args.batch_size, "log_every": 10},
                optim={"name": "adamw", "lr": 0.001}, tensorboard=False, report=False)
            rows.append((name, summary["samples_per_second"], summary["final_val_accuracy"]))
    padding = {False: LengthBucketSampler(train.lengths, args.batch_size, pool_batches=1),
               True: sampler}
    print(f"\n{'batches':<16} {'padding':>8} {'samples/s':>10} {'val acc':>8} {'ratio':>6}")
    for (name, rate, accuracy), bucketing in zip(rows, (False, True)):
        print(f"{name:<16} {padding[bucketing].padding_fraction():>8.1%} {rate:>10,.0f} "
              f"{accuracy:>8.3f} {rate / rows[0][1]:>6.2f}")


if __name__ == "__main__":
    main()
