"""`hpctrain pack` as the folder grows: 10,000, 100,000 and 1,000,000 small JPEGs (1x / 10x /
100x), files per second per core and peak memory, and the exponent of growth of each
(time ~ files^exponent: 1 is linear, so files/s/core stays constant; memory's 0 is flat).

The source is an ImageFolder of 100 classes whose files are copies of 256 distinct small
photographs (64 x 48 pixels cut from scikit-image's, quality 90, about 2 KB): what the pack
does per file (open, read, decode at an eighth, checksum, append to a tar) is the same as
for distinct ones, and a million files are written in a minute. Each size is packed in a
fresh process: the memory it adds to its peak resident size while packing (getrusage); each
worker holds one shard's job at a time (at most SHARD_SAMPLES files).

    python benchmarks/pack_growth.py --sizes 10000 100000 1000000 --workers 2
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import time
from pathlib import Path

import numpy as np
from PIL import Image

from growth import exponent, in_child
from hpctrain.data.images.image_packing import PackOptions, pack  # imported before the
# children fork: their memory added is the packing's, not the imports' (torch's 450 MB)

CLASSES = 100


def payloads(count: int = 256) -> list[bytes]:
    """`count` distinct small JPEGs cut from scikit-image's photographs."""
    from skimage import data

    sources = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    rng = np.random.default_rng(0)
    out = []
    for number in range(count):
        source = sources[number % len(sources)]
        top = rng.integers(source.shape[0] - 96)
        left = rng.integers(source.shape[1] - 128)
        cut = Image.fromarray(source[top:top + 96, left:left + 128]).resize((64, 48))
        buffer = io.BytesIO()
        cut.save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def grow_folder(root: Path, size: int, have: int, blobs: list[bytes]) -> None:
    """Add files `have` to `size - 1` to the ImageFolder at `root`."""
    for number in range(have, size):
        folder = root / f"class{number % CLASSES:03d}"
        if number < CLASSES:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{number:07d}.jpg").write_bytes(blobs[number % len(blobs)])


def pack_seconds(src: Path, dst: Path, workers: int) -> float:
    started = time.perf_counter()
    pack(src, dst, PackOptions(), workers=workers, overwrite=True, log=lambda *a, **k: None)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--cache-dir", default="/tmp/hpctrain-bench-pack")
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    root = Path(args.cache_dir)
    source = root / "folder"
    have = sum(1 for _ in source.rglob("*.jpg")) if source.is_dir() else 0
    if have > sizes[0]:  # a folder from a larger earlier run: start again
        shutil.rmtree(source)
        have = 0
    blobs = payloads()
    rows = []
    for size in sizes:
        began = time.perf_counter()
        grow_folder(source, size, have, blobs)
        have = size
        print(f"{size:,} files in the folder ({time.perf_counter() - began:.1f} s to add)",
              flush=True)
        seconds, added = in_child(lambda: pack_seconds(source, root / "packed", args.workers))
        rows.append((size, seconds, size / seconds / args.workers, added))
        shutil.rmtree(root / "packed")
    print(f"pack_growth: small JPEGs (64 x 48, q90, ~2 KB), {args.workers} workers")
    print(f"{'files':>10}{'seconds':>10}{'files/s/core':>14}{'MB added':>10}")
    for size, seconds, per_core, added in rows:
        print(f"{size:>10,}{seconds:>10.1f}{per_core:>14.0f}{added:>10.0f}")
    if len(sizes) > 1:
        print(f"{'exponent':>10}{exponent(sizes, [r[1] for r in rows]):>10.2f}"
              f"{exponent(sizes, [r[2] for r in rows]):>14.2f}"
              f"{exponent(sizes, [max(r[3], 1) for r in rows]):>10.2f}")


if __name__ == "__main__":
    main()
