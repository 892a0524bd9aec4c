"""Tokens per second per core of three ways to feed a language model blocks of a token stream:
hpctrain's token pack (`data.tokens.batching=blocks`: TokenBlocks through its loader), nanoGPT's
`get_batch` (a fresh np.memmap of one .bin file per batch, random offsets, one torch.stack for
the inputs and one for the targets, in the training process), and LitData's `TokensLoader`
(`litdata.optimize` of the same tokens into chunks, `StreamingDataset` +
`StreamingDataLoader`). The same stream (byte-level tokens of random text, uint16) in all
three, batch 8, at each sequence length; rounds alternate between the loaders, medians printed.

"In-process" reads in the training process itself (0 workers: one core); "2 workers" divides
the rate by the 2 worker processes that do the reading (the training process only receives).
hpctrain's rows read into its batch buffers, as a run does (data.loader=auto); "torch's" is the
same pack through torch's DataLoader (data.loader=torch).

    python benchmarks/token_loader.py --tokens 20000000 --seq-lens 1024 8192 --rounds 3
Needs litdata (the test and bench extras).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.loader import SignalSafeLoader
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.tokens.token_pack import TokenBlocks, TokenPack
from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens

BATCH = 8


def corpus(root: Path, tokens: int) -> Path:
    """Random printable text of `tokens` bytes (the byte tokenizer: one token per byte), in
    files of 8 MB, packed once into a token pack."""
    packed = root / f"tokens-{tokens}"
    if (packed / "pack.json").exists():
        return packed
    text = root / f"text-{tokens}"
    text.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = 8 << 20
    for number, start in enumerate(range(0, tokens, per_file)):
        size = min(per_file, tokens - start)
        letters = rng.integers(32, 127, size=size, dtype=np.uint8)
        (text / f"{number:04d}.txt").write_bytes(letters.tobytes())
    pack_tokens(text, packed, TokenPackOptions(val_fraction=0.0), overwrite=True,
                log=lambda *a, **k: None)
    return packed


def nanogpt_bin(root: Path, packed: Path) -> Path:
    """The pack's training tokens as one uint16 .bin, as nanoGPT's prepare.py writes it."""
    out = root / f"{packed.name}-train.bin"
    if not out.exists():
        split = TokenPack(packed).split("train")
        with open(out, "wb") as handle:
            for number in range(len(split.shards)):
                handle.write(np.asarray(split.shard(number), dtype=np.uint16).tobytes())
    return out


def nanogpt_batches(path: Path, seq_len: int, count: int):
    """nanoGPT's train.py get_batch (CPU side), `count` times."""
    for _ in range(count):
        data = np.memmap(path, dtype=np.uint16, mode="r")  # recreated every batch, as there
        ix = torch.randint(len(data) - seq_len, (BATCH,))
        x = torch.stack([torch.from_numpy(data[i:i + seq_len].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + seq_len].astype(np.int64))
                         for i in ix])
        yield x, y


def hpctrain_batches(packed: Path, seq_len: int, count: int, workers: int,
                     buffers: bool = True):
    """Blocks of the pack as `data.tokens.batching=blocks` reads them (the run's sampler, and
    its batch buffers or, with `buffers` false, torch's DataLoader as data.loader=torch),
    `count` batches."""
    blocks = TokenBlocks(TokenPack(packed).split("train"), seq_len)
    sampler = EpochSampler(len(blocks), 0, shuffle=True, seed=0)
    if buffers:
        loader = BufferedLoader(blocks, sampler, BATCH, True, workers, 0, prefetch_factor=4)
    else:
        loader = SignalSafeLoader(blocks, batch_size=BATCH, sampler=sampler, drop_last=True,
                                  num_workers=workers, prefetch_factor=4 if workers else None)
    for number, batch in enumerate(loader):
        if number == count:
            return
        yield batch


def litdata_chunks(root: Path, packed: Path, seq_len: int) -> Path:
    """The same tokens optimised by LitData for its TokensLoader, once per sequence length
    (its chunks hold whole blocks)."""
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    out = root / f"{packed.name}-litdata-{seq_len}"
    if not (out / "index.json").exists():
        split = TokenPack(packed).split("train")
        litdata.optimize(fn=_shard_tokens, inputs=[(str(p), str(split.dtype))
                                                  for p in split.shards],
                         output_dir=str(out), chunk_size=(seq_len + 1) * 512,
                         item_loader=TokensLoader(), num_workers=1, mode="overwrite",
                         start_method="fork")
    return out


def _shard_tokens(item: tuple[str, str]):
    path, dtype = item
    yield torch.from_numpy(np.fromfile(path, dtype=dtype).astype(np.int32))


def litdata_batches(chunks: Path, seq_len: int, count: int, workers: int, cache: Path):
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    dataset = StreamingDataset(str(chunks), cache_dir=str(cache), shuffle=True,
                               item_loader=TokensLoader(block_size=seq_len + 1))
    loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                 drop_last=True)
    for number, batch in enumerate(loader):
        if number == count:
            return
        yield batch


def tokens_per_second(batches, seq_len: int, warmup: int = 3) -> float:
    count, started = 0, None
    for number, _ in enumerate(batches):
        if number == warmup:
            started, count = time.perf_counter(), 0
        count += BATCH * seq_len
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--batches", type=int, default=200, help="measured per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-dir", default="/tmp/hpctrain-bench-tokens")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(args.cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    packed = corpus(root, args.tokens)
    bin_file = nanogpt_bin(root, packed)
    n = args.batches + 3
    print(f"token_loader: {args.tokens:,} byte tokens (uint16), batch {BATCH}, "
          f"{args.batches} batches per row, median of {args.rounds} alternating rounds")
    print(f"{'seq_len':>7}  {'loader':<34}{'tokens/s/core':>14}{'hpctrain/this':>15}")
    for seq_len in args.seq_lens:
        chunks = litdata_chunks(root, packed, seq_len)
        rows = {
            "hpctrain pack, in-process": (lambda: hpctrain_batches(packed, seq_len, n, 0), 1),
            "nanoGPT get_batch, in-process": (lambda: nanogpt_batches(bin_file, seq_len, n), 1),
            "LitData TokensLoader, in-process": (
                lambda: litdata_batches(chunks, seq_len, n, 0, root / "lit-cache"), 1),
            "hpctrain pack, 2 workers": (lambda: hpctrain_batches(packed, seq_len, n, 2), 2),
            "hpctrain pack, 2 workers, torch's": (
                lambda: hpctrain_batches(packed, seq_len, n, 2, buffers=False), 2),
            "LitData TokensLoader, 2 workers": (
                lambda: litdata_batches(chunks, seq_len, n, 2, root / "lit-cache"), 2),
        }
        rates: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.rounds):
            for name, (make, cores) in rows.items():
                rates[name].append(tokens_per_second(make(), seq_len) / cores)
        medians = {name: float(np.median(values)) for name, values in rates.items()}
        for name, value in medians.items():
            ours = medians["hpctrain pack, 2 workers" if "workers" in name
                           else "hpctrain pack, in-process"]
            print(f"{seq_len:>7}  {name:<34}{value:>14,.0f}{ours / value:>15.2f}")


if __name__ == "__main__":
    main()
