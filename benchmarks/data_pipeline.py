"""Input pipeline throughput: hpctrain's pack against torchvision ImageFolder + PIL,
WebDataset over the same tar shards, LitData and MosaicML Streaming (each in the format and
reading path its documentation recommends for JPEGs: benchmarks/peer_loaders.py), and the
decode-only limit of the same cores; then the time each format takes to build from the folder.

The images are generated (photo-like JPEGs: 1/f colour noise, the spectrum of natural
images, of ImageNet's typical 500x375 size at quality 90), cut from the photographs bundled
with scikit-image (`--photographs`, the same sizes and quality), or your own
(`--images-from`), in ImageFolder layout, then packed. Every loader uses the same workers,
batch and augmentation (random-resized-crop 224 + flip, uint8 out). (c) reads the pack
through hpctrain's batch buffers (data.loader=auto), (c-) through torch's DataLoader. (c') is
a pack with half the images stored raw (FFCV's mix), (c'') one with all of them raw (no
decoding at all, 6.8x the bytes); on a machine with CUDA, (e) adds batched nvJPEG decoding on
the GPU. `--rounds N` measures every row once per round, in turn, and prints the medians.
Run:
    python benchmarks/data_pipeline.py --images 3000 --workers 2 --rounds 3
    python benchmarks/data_pipeline.py --images 3000 --workers 2 --rounds 3 --photographs
Needs `pip install -e ".[bench]"` (webdataset, simplejpeg, litdata, scikit-image); MosaicML
Streaming is installed on first use into --peers-dir (peer_loaders.py says why).
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

import peer_loaders
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
    packed JPEGs at full size: the GPU's own decode limit, for data.images.decode=gpu."""
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


def photographs(root: Path, images: int, classes: int = 10) -> Path:
    """`images` JPEGs of ImageNet's typical size (500x375, 375x500 or 500x333) at quality 90,
    cut at random places and scales from the colour photographs bundled with scikit-image
    (astronaut, cat, coffee, rocket, the two motorcycle views), in ImageFolder layout."""
    marker = root / f"complete-photographs-{images}"
    if marker.exists():
        return root / "photographs"
    from skimage import data

    sources = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(),
               *data.stereo_motorcycle()[:2]]
    rng = np.random.default_rng(0)
    for i in range(images):
        source = sources[i % len(sources)]
        width, height = [(500, 375), (375, 500), (500, 333)][rng.integers(3)]
        scale = rng.uniform(0.5, 1.0)
        crop_h = int(min(source.shape[0], source.shape[1] * height / width) * scale)
        crop_w = int(crop_h * width / height)
        top = rng.integers(source.shape[0] - crop_h + 1)
        left = rng.integers(source.shape[1] - crop_w + 1)
        cut = Image.fromarray(source[top:top + crop_h, left:left + crop_w])
        folder = root / "photographs" / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        cut.resize((width, height), Image.LANCZOS).save(folder / f"{i:06d}.jpg", "JPEG",
                                                         quality=90)
    marker.touch()
    return root / "photographs"


def packed_variants(root: Path, folder: Path, images: int, workers: int) -> dict:
    """The pack as (c) reads it, half raw (c'), all raw (c''), each built once; and the
    seconds the first took, for the build table."""
    built, seconds = {}, {}
    for name, options in (("", PackOptions(shard_bytes=16 << 20)),
                          ("-half-raw", PackOptions(store="auto", raw_fraction=0.5,
                                                    shard_bytes=64 << 20)),
                          ("-raw", PackOptions(store="raw", shard_bytes=256 << 20))):
        built[name] = root / f"packed-{images}{name}"
        if not (built[name] / "pack.json").exists():
            started = time.perf_counter()
            pack(folder, built[name], options, workers=workers, overwrite=True,
                 log=lambda *a, **k: None)
            seconds[name] = time.perf_counter() - started
    return {"pack": built[""], "mixed": built["-half-raw"], "raw": built["-raw"],
            "pack_seconds": seconds.get("")}


def peer_formats(root: Path, folder: Path, images: int, workers: int, peers: Path) -> dict:
    """LitData's chunks and MosaicML's MDS shards of `folder`, each built once, and the
    seconds each build took (None: built by an earlier run)."""
    lit, mds = root / f"litdata-{images}", root / f"mds-{images}"
    seconds = {}
    if not (lit / "index.json").exists():
        seconds["litdata"] = peer_loaders.build_litdata(folder, lit, workers)
    peer_loaders.streaming_library(peers / "mosaicml-streaming-0.13.0")
    if not (mds / "index.json").exists():
        seconds["mds"] = peer_loaders.build_mds(folder, mds)
    return {"litdata": lit, "mds": mds, "seconds": seconds}


def loaders(folder: Path, built: dict, peers: dict, args, cache: Path) -> dict:
    """Each row's loader, made fresh for every round (no worker or page cache state carried
    from one row into the next beyond what the operating system keeps)."""
    w, b = args.workers, args.batch
    shards = Pack(built["pack"]).split("train").shards
    return {
        "(a) ImageFolder + PIL": lambda: imagefolder_loader(folder, w, b),
        "(b) WebDataset, same tars": lambda: webdataset_loader(shards, w, b, args.images),
        "(c) hpctrain shards": lambda: shard_loader(built["pack"], w, b),
        "(c-) shards, torch loader": lambda: shard_loader(built["pack"], w, b, buffers=False),
        "(c') shards, half raw": lambda: shard_loader(built["mixed"], w, b),
        "(c'') shards, all raw": lambda: shard_loader(built["raw"], w, b),
        "(f) LitData": lambda: peer_loaders.litdata_loader(peers["litdata"], w, b,
                                                           cache / "litdata-cache"),
        "(g) MosaicML Streaming": lambda: peer_loaders.streaming_loader(peers["mds"], w, b),
    }


def print_build_table(images: int, workers: int, built: dict, peers: dict) -> None:
    """Files per second per core of each format's build from the same folder."""
    rows = [("hpctrain pack", built["pack_seconds"], workers),
            ("litdata.optimize", peers["seconds"].get("litdata"), workers),
            ("MDSWriter (jpeg column)", peers["seconds"].get("mds"), 1)]
    print(f"{'build from the folder':<26}{'seconds':>9}{'processes':>10}{'files/s/core':>14}")
    for name, seconds, processes in rows:
        if seconds is None:
            print(f"{name:<26}{'(built by an earlier run: delete it to time it)':>33}")
        else:
            print(f"{name:<26}{seconds:>9.1f}{processes:>10}"
                  f"{images / seconds / processes:>14.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternating rounds: every row once per round, medians printed")
    parser.add_argument("--cache-dir", default="/tmp/hpctrain-bench-data")
    parser.add_argument("--peers-dir", default="~/.cache/hpctrain-bench/peers",
                        help="where MosaicML Streaming is installed on first use")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--photographs", action="store_true",
                        help="JPEGs cut from scikit-image's bundled photographs instead of "
                        "generated ones")
    source.add_argument("--images-from", metavar="FOLDER", help="your own photographs in "
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
        source = args.images_from
    elif args.photographs:
        root = root / "photographs"
        folder, source = photographs(root, args.images), "scikit-image photographs, q90"
    else:
        folder, source = make_dataset(root, args.images), "generated, 500x375 q90"
    built = packed_variants(root, folder, args.images, args.workers)
    peers = peer_formats(root, folder, args.images, args.workers,
                         Path(args.peers_dir).expanduser())
    makers = loaders(folder, built, peers, args, root)
    rounds: dict[str, list[float]] = {name: [] for name in [*makers, "(d) decode-only limit"]}
    for _ in range(args.rounds):
        for name, make in makers.items():
            rounds[name].append(rate(make()))
        rounds["(d) decode-only limit"].append(decode_only(built["pack"], args.workers))
    results = {name: float(np.median(values)) for name, values in rounds.items()}
    if torch.cuda.is_available():
        results["(e) nvJPEG batched decode, 1 GPU"] = nvjpeg_rate(built["pack"])
    print(f"data_pipeline: {args.images} JPEGs ({source}), {args.workers} workers, batch "
          f"{args.batch}, random-resized-crop {SIZE} + flip; decoder {jpeg_decoder()}; "
          f"median of {args.rounds} alternating round(s); (c') = pack --store auto "
          "--raw-fraction 0.5, (c'') = pack --store raw; (c-) = the same pack through "
          "torch's DataLoader (data.loader=torch)")
    ours, mix = results["(c) hpctrain shards"], results["(c') shards, half raw"]
    print(f"{'loader':<26}{'img/s':>8}{'(c)/this':>10}{'(c' + chr(39) + ')/this':>11}")
    for name, value in results.items():
        print(f"{name:<26}{value:>8.0f}{ours / value:>10.2f}{mix / value:>11.2f}")
    print_build_table(args.images, args.workers, built, peers)


if __name__ == "__main__":
    main()
