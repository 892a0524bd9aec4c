"""Input pipeline throughput: hpctrain shards against torchvision ImageFolder + PIL, WebDataset
over the same tar shards, and the decode-only limit of the same cores.

The dataset is generated: photo-like JPEGs (1/f colour noise, the spectrum of natural images)
of ImageNet's typical 500x375 size at quality 90, in ImageFolder layout, then packed. Every
loader uses the same workers, batch and augmentation (random-resized-crop 224 + flip, uint8
out). (c) reads the pack through hpctrain's batch buffers (data.loader=auto), (c-) through
torch's DataLoader. (c') is a pack with half the images stored raw (FFCV's mix), (c'') one
with all of them raw (no decoding at all, 6.8x the bytes); on a machine with CUDA, (e)
adds batched nvJPEG decoding on the GPU. Run:
    python benchmarks/data_pipeline.py --images 3000 --workers 2
Needs `pip install -e ".[bench]"` (webdataset, simplejpeg).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from hpctrain.config import AugmentConfig
from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.images.image_pack_dataset import ShardDataset, decode_jpeg, jpeg_decoder
from hpctrain.data.images.image_pack import Pack, ShardReader

SIZE = 224


def photo(seed: int, width: int = 500, height: int = 375) -> Image.Image:
    rng = np.random.default_rng(seed)
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    falloff = np.sqrt(fx ** 2 + fy ** 2)
    falloff[0, 0] = 1
    base, channels = None, []
    for _ in range(3):  # correlated channels, as in photographs
        spectrum = rng.standard_normal(falloff.shape) + 1j * rng.standard_normal(falloff.shape)
        plane = np.fft.irfft2(spectrum / falloff, s=(height, width))
        base = plane if base is None else 0.7 * base + 0.3 * plane
        channels.append(base)
    pixels = np.stack(channels, -1)
    pixels = (pixels - pixels.min()) / (pixels.max() - pixels.min()) * 255
    return Image.fromarray(pixels.astype(np.uint8))


def _write(args: tuple[Path, int]) -> None:
    path, seed = args
    photo(seed).save(path, "JPEG", quality=90)


def make_dataset(root: Path, images: int, classes: int = 10) -> Path:
    marker = root / f"complete-{images}"
    if marker.exists():
        return root / "images"
    jobs = []
    for i in range(images):
        folder = root / "images" / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((folder / f"{i:06d}.jpg", i))
    with multiprocessing.Pool() as pool:
        pool.map(_write, jobs, chunksize=16)
    marker.touch()
    return root / "images"


def rate(loader, warmup: int = 2) -> float:
    """Images per second over one pass after `warmup` batches."""
    count, started = 0, None
    for i, (images, _) in enumerate(loader):
        if i == warmup:
            started, count = time.perf_counter(), 0
        count += len(images)
    return count / (time.perf_counter() - started)


def imagefolder_loader(folder: Path, workers: int, batch: int):
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.RandomResizedCrop(SIZE),
                                    transforms.RandomHorizontalFlip(),
                                    transforms.PILToTensor()])
    dataset = datasets.ImageFolder(str(folder), transform=transform)
    return DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                      drop_last=True, persistent_workers=False, prefetch_factor=4)


def webdataset_loader(shards: list[Path], workers: int, batch: int, samples: int):
    import webdataset as wds
    from torchvision import transforms

    transform = transforms.Compose([transforms.RandomResizedCrop(SIZE),
                                    transforms.RandomHorizontalFlip(),
                                    transforms.PILToTensor()])
    dataset = (wds.WebDataset([str(s) for s in shards], shardshuffle=len(shards),
                              nodesplitter=None, empty_check=False)
               .shuffle(1000).decode("pil").to_tuple("jpg", "cls")
               .map_tuple(transform, int).batched(batch, partial=False))
    return wds.WebLoader(dataset, batch_size=None, num_workers=workers,
                         prefetch_factor=4).with_epoch(samples // batch)


def shard_loader(packed: Path, workers: int, batch: int, buffers: bool = True):
    """hpctrain's loader of a pack: batch buffers (data.loader=auto), or torch's DataLoader
    over the same dataset (data.loader=torch, the path before issue 24)."""
    split = Pack(packed).split("train")
    dataset = ShardDataset(split, None, True, AugmentConfig(crop_scale=(0.08, 1.0)), 0)
    sampler = EpochSampler(len(dataset), SIZE, shuffle=True)
    if buffers:
        return BufferedLoader(dataset, sampler, batch, True, workers, SIZE, prefetch_factor=4)
    return DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers,
                      drop_last=True, prefetch_factor=4)


def _decode_all(args: tuple[list[Path], int, int]) -> int:
    shards, start, step = args
    split_index = np.load(Path(shards[0]).parent / "train.index.npy", mmap_mode="r")
    reader = ShardReader(shards)
    for record in split_index[start::step]:
        decode_jpeg(reader.read(record), int(record["width"]), int(record["height"]))
    return len(split_index[start::step])


def decode_only(packed: Path, workers: int) -> float:
    """The same cores doing nothing but full-size decoding of the JPEGs, with the fastest
    decoder installed (simplejpeg, else PIL), read from memory: no file opens, no augmentation,
    no batching."""
    shards = Pack(packed).split("train").shards
    with multiprocessing.Pool(workers) as pool:
        pool.map(_decode_all, [(shards, 0, 50)] * workers)  # warm the page cache and imports
        started = time.perf_counter()
        count = sum(pool.map(_decode_all, [(shards, i, workers) for i in range(workers)]))
        return count / (time.perf_counter() - started)


def nvjpeg_rate(packed: Path, batch: int = 256, rounds: int = 5) -> float:
    """Batched nvJPEG decoding (torchvision.io.decode_jpeg on a list, device='cuda') of the
    packed JPEGs at full size: the GPU's own decode limit, for data.decode=gpu."""
    from torchvision.io import ImageReadMode, decode_jpeg

    split = Pack(packed).split("train")
    reader = ShardReader(split.shards)
    payloads = [torch.frombuffer(bytearray(reader.read(r)), dtype=torch.uint8)
                for r in split.index[:batch]]
    decode_jpeg(payloads, mode=ImageReadMode.RGB, device="cuda")  # warm-up: nvJPEG handles
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(rounds):
        decode_jpeg(payloads, mode=ImageReadMode.RGB, device="cuda")
    torch.cuda.synchronize()
    return batch * rounds / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cache-dir", default="/tmp/hpctrain-bench-data")
    parser.add_argument("--images-from", metavar="FOLDER", help="your own photographs in "
                        "ImageFolder layout (FOLDER/<class>/*.jpg) instead of generated ones; "
                        "packed once into --cache-dir")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(args.cache_dir)
    if args.images_from:
        folder = Path(args.images_from).expanduser().resolve()
        args.images = sum(1 for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
        root = root / f"from-{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"
        root.mkdir(parents=True, exist_ok=True)
    else:
        folder = make_dataset(root, args.images)
    packed = root / f"packed-{args.images}"
    if not (packed / "pack.json").exists():
        pack(folder, packed, PackOptions(shard_bytes=16 << 20), overwrite=True)
    mixed = root / f"packed-{args.images}-half-raw"
    if not (mixed / "pack.json").exists():
        pack(folder, mixed, PackOptions(store="auto", raw_fraction=0.5, shard_bytes=64 << 20),
             overwrite=True)
    raw = root / f"packed-{args.images}-raw"
    if not (raw / "pack.json").exists():
        pack(folder, raw, PackOptions(store="raw", shard_bytes=256 << 20), overwrite=True)
    shards = Pack(packed).split("train").shards
    results = {
        "(a) ImageFolder + PIL": rate(imagefolder_loader(folder, args.workers, args.batch)),
        "(b) WebDataset, same tars": rate(webdataset_loader(shards, args.workers, args.batch,
                                                            args.images)),
        "(c) hpctrain shards": rate(shard_loader(packed, args.workers, args.batch)),
        "(c-) shards, torch loader": rate(shard_loader(packed, args.workers, args.batch,
                                                       buffers=False)),
        "(c') shards, half raw": rate(shard_loader(mixed, args.workers, args.batch)),
        "(c'') shards, all raw": rate(shard_loader(raw, args.workers, args.batch)),
        "(d) decode-only limit": decode_only(packed, args.workers),
    }
    if torch.cuda.is_available():
        results["(e) nvJPEG batched decode, 1 GPU"] = nvjpeg_rate(packed)
    source = args.images_from or "generated, 500x375 q90"
    print(f"data_pipeline: {args.images} JPEGs ({source}), {args.workers} workers, batch "
          f"{args.batch}, random-resized-crop {SIZE} + flip; decoder {jpeg_decoder()}; "
          "(c') = pack --store auto --raw-fraction 0.5, (c'') = pack --store raw; (c-) = "
          "the same pack through torch's DataLoader (data.loader=torch)")
    ours, mix = results["(c) hpctrain shards"], results["(c') shards, half raw"]
    print(f"{'loader':<26}{'img/s':>8}{'(c)/this':>10}{'(c' + chr(39) + ')/this':>11}")
    for name, value in results.items():
        print(f"{name:<26}{value:>8.0f}{ours / value:>10.2f}{mix / value:>11.2f}")


if __name__ == "__main__":
    main()
