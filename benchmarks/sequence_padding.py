"""Compute per real token on a token pack: block packing, length-bucketed documents, documents
in random batches padded per batch, and documents padded to the context.

A corpus of documents of log-normal length (like web text: most short, a long tail) is packed
with `hpctrain pack --tokens`'s code (byte tokenizer), then read the four ways a language model
can be fed from it. For each: the positions the model computes per real token (inputs rounded
up to a multiple of 8 as pad_documents does), the FLOPs per real token of a GPT (PaLM's count:
6 x the weights' multiply-adds plus 12 x layers x width x sequence width for attention, over
the width each batch really has) against blocks, and the real tokens/s the DataLoader delivers.

    python benchmarks/sequence_padding.py                       # 20,000 documents, GPT-124M
    python benchmarks/sequence_padding.py --seq-len 2048 --median-tokens 800
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

from hpctrain.data.tokens.sequences import LengthBucketSampler
from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens
from hpctrain.data.tokens.tokenizer import BYTE_EOS
from hpctrain.data.tokens.token_pack import TokenBlocks, TokenDocuments, TokenPack, pad_documents
from hpctrain.models.gpt import SIZES

MULTIPLE = 8  # pad_documents rounds the model's input width up to this


def write_corpus(src: Path, documents: int, median: float, sigma: float, longest: int) -> None:
    """train/ and val/ .jsonl files of lowercase text, one byte (= one token) per character."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(median), sigma, documents), 4, longest).astype(int)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", np.uint8)
    for split, part in (("train", lengths), ("val", lengths[:10])):
        (src / split).mkdir(parents=True)
        with open(src / split / "corpus.jsonl", "w") as out:
            for length in part:
                text = letters[rng.integers(0, len(letters), length)].tobytes().decode()
                out.write(json.dumps({"text": text}) + "\n")


def gpt_flops(size: str, vocab_size: int):
    """FLOPs per position of forward + backward at sequence width T: weights, attention."""
    shape = SIZES[size]
    weights = 6 * (12 * shape.layers * shape.width ** 2 + vocab_size * shape.width)
    return lambda width: weights + 12 * shape.layers * shape.width * width


def document_costs(lengths: np.ndarray, batches: list[list[int]], flops, fixed: int | None):
    """(positions, FLOPs, real tokens) of padded document batches; `fixed`: every batch padded
    to that input width instead of its own longest."""
    positions = total_flops = real = 0
    for batch in batches:
        inputs = lengths[batch] - 1  # a sample of n tokens is n - 1 inputs and targets
        width = fixed or -(-int(inputs.max()) // MULTIPLE) * MULTIPLE
        positions += width * len(batch)
        total_flops += width * len(batch) * flops(width)
        real += int(inputs.sum())
    return positions, total_flops, real


def loader_rate(loader, seconds: float) -> float:
    """Real tokens/s the DataLoader delivers (inputs, padding left out), for `seconds`."""
    started, real = time.perf_counter(), 0
    for batch in loader:
        real += int((batch["lengths"] - 1).sum()) if isinstance(batch, dict) else \
            batch.shape[0] * (batch.shape[1] - 1)
        if time.perf_counter() - started > seconds:
            break
    return real / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--median-tokens", type=float, default=400)
    parser.add_argument("--sigma", type=float, default=1.0, help="of the log-normal lengths")
    parser.add_argument("--longest", type=int, default=16_384, help="longest document")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--model", default="124m", choices=sorted(SIZES), help="GPT size")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3, help="loader timing per row")
    parser.add_argument("--cache-dir", help="scratch folder (default: a temporary one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.cache_dir) as scratch:
        write_corpus(Path(scratch) / "src", args.documents, args.median_tokens, args.sigma,
                     args.longest)
        pack_tokens(Path(scratch) / "src", Path(scratch) / "pack", TokenPackOptions(),
                    workers=1, log=lambda _: None)
        pack = TokenPack(Path(scratch) / "pack")
        split = pack.split("train")
        flops = gpt_flops(args.model, 50304)
        blocks = TokenBlocks(split, args.seq_len)
        documents = TokenDocuments(split, args.seq_len, BYTE_EOS)
        bucketed = LengthBucketSampler(documents.lengths, args.batch_size)
        random_batches = LengthBucketSampler(documents.lengths, args.batch_size, pool_batches=1)
        common = dict(num_workers=args.workers, persistent_workers=False)
        block_rows = len(blocks) // args.batch_size * args.batch_size
        rows = [("blocks (hpctrain's default)",
                 (block_rows * args.seq_len, block_rows * args.seq_len * flops(args.seq_len),
                  block_rows * args.seq_len),
                 DataLoader(blocks, batch_size=args.batch_size, shuffle=True, drop_last=True,
                            **common)),
                ("documents, length-bucketed (hpctrain)",
                 document_costs(documents.lengths, bucketed.batches(), flops, None),
                 DataLoader(documents, batch_sampler=bucketed, collate_fn=pad_documents,
                            **common)),
                ("documents, random batches, padded per batch",
                 document_costs(documents.lengths, random_batches.batches(), flops, None),
                 DataLoader(documents, batch_sampler=random_batches, collate_fn=pad_documents,
                            **common)),
                ("documents padded to the context",
                 document_costs(documents.lengths, random_batches.batches(), flops,
                                args.seq_len), None)]
        blocks_flops = flops(args.seq_len)
        results = [(name, positions / real, total / real / blocks_flops,
                    loader_rate(loader, args.seconds) if loader is not None else None)
                   for name, (positions, total, real), loader in rows]
    lengths = split.documents["length"]
    print(f"sequence_padding: {len(lengths)} documents, median {int(np.median(lengths))} tokens, "
          f"longest {int(lengths.max())}; context {args.seq_len}, batch {args.batch_size}, "
          f"GPT-{args.model} FLOPs, {args.workers} workers")
    print(f"{'batching':<46}{'positions/real':>15}{'FLOPs/real vs blocks':>22}{'real tok/s':>12}")
    for name, per_real, relative, rate in results:
        speed = f"{rate:>12,.0f}" if rate else f"{'':>12}"
        print(f"{name:<46}{per_real:>15.3f}{relative:>22.3f}{speed}")


if __name__ == "__main__":
    main()
