"""Where an image's time goes in the input pipeline, stage by stage, per image.

In one process, over the packed JPEGs of benchmarks/data_pipeline.py (generated 500x375
photographs at quality 90, or `--pack` of your own): reading with the CRC-32 check, decoding,
the crop copy, the resize to 224, the flip, and (torch's DataLoader) stacking the sample into
its batch; then the loader's own cost of moving a finished sample from a worker to the
training process (a dataset whose samples are ready, through the loader with one worker):
torch's DataLoader, or hpctrain's batch buffers (`--loader`). The sum is what one core spends
per image; the decode-only limit spends only the decode.

    python benchmarks/data_stages.py --images 3000 --loader torch     # before issue 24
    python benchmarks/data_stages.py --images 3000                    # batch buffers
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hpctrain.config import AugmentConfig
from hpctrain.data.batch_buffers import BufferedLoader, ImageRows
from hpctrain.data.images.image_folders import crop_rows_columns, draw_view
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.sampling import EpochSampler, SampleKey
from hpctrain.data.images.image_pack_dataset import ShardDataset, dct_reduction, stored_pixels
from hpctrain.data.images.image_pack import Pack

SIZE = 224
BATCH = 64


class Ready(Dataset):
    """A finished sample every time: what is left is the loader's moving of it."""

    def __init__(self, count: int):
        self.count, self.image = count, torch.zeros(SIZE, SIZE, 3, dtype=torch.uint8)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        return self.image, 0


def stages(dataset: ShardDataset, count: int) -> dict[str, float]:
    """Mean milliseconds per image of each stage, over `count` images."""
    totals = dict.fromkeys(("read + CRC-32", "decode", "crop copy", "resize", "flip",
                            "into the batch"), 0.0)
    batch = []
    for position in range(count):
        key = SampleKey(position, 0, SIZE)
        record = dataset.record(position)
        width, height = int(record["width"]), int(record["height"])
        box, flip = draw_view(dataset.seed, key, width, height, True, dataset.augment, 1.0)
        marks = [time.perf_counter()]
        data = dataset.reader.read(record)
        marks.append(time.perf_counter())
        pixels = stored_pixels(data, record, dct_reduction(box, SIZE))
        marks.append(time.perf_counter())
        sx, sy = pixels.shape[1] / width, pixels.shape[0] / height
        box = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
        crop = np.array(pixels[crop_rows_columns(box)], copy=True)
        marks.append(time.perf_counter())
        image = torch.from_numpy(crop)[None].permute(0, 3, 1, 2)
        image = torch.nn.functional.interpolate(image, size=(SIZE, SIZE), mode="bilinear",
                                                antialias=True, align_corners=False)
        image = image[0].permute(1, 2, 0)
        marks.append(time.perf_counter())
        if flip:
            image = image.flip(1)
        marks.append(time.perf_counter())
        batch.append(image)
        if len(batch) == BATCH:
            torch.stack(batch)
            batch = []
        marks.append(time.perf_counter())
        for name, start, end in zip(totals, marks, marks[1:]):
            totals[name] += end - start
    return {name: seconds / count * 1e3 for name, seconds in totals.items()}


class ReadyRows(ImageRows, Ready):
    """For batch buffers: a sample whose row is already written."""

    def render_into(self, key, out) -> int:
        return 0


def transport(count: int, buffers: bool) -> float:
    """Milliseconds per image a loader with one worker spends moving finished samples to
    this process: torch's DataLoader (stacking and a new shared-memory batch each time), or
    the batch buffers (a message per batch)."""
    if buffers:
        loader = BufferedLoader(ReadyRows(count), EpochSampler(count, SIZE, shuffle=False),
                                BATCH, True, 1, SIZE)
    else:
        loader = DataLoader(Ready(count), batch_size=BATCH, num_workers=1, prefetch_factor=4,
                            drop_last=True)
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    started, seen = time.perf_counter(), 0
    for images, _ in iterator:
        seen += len(images)
    return (time.perf_counter() - started) / seen * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--cache-dir", default="/tmp/hpctrain-bench-data")
    parser.add_argument("--pack", help="a JPEG pack of your own instead")
    parser.add_argument("--count", type=int, default=1000, help="images timed")
    parser.add_argument("--loader", choices=("buffers", "torch"), default="buffers",
                        help="batch buffers (data.loader=auto) or torch's DataLoader")
    args = parser.parse_args()
    torch.set_num_threads(1)
    packed = Path(args.pack) if args.pack else Path(args.cache_dir) / f"packed-{args.images}"
    if not (packed / "pack.json").exists():  # data_pipeline.py's generated photographs
        from data_pipeline import make_dataset

        pack(make_dataset(Path(args.cache_dir), args.images), packed,
             PackOptions(shard_bytes=16 << 20), overwrite=True)
    dataset = ShardDataset(Pack(packed).split("train"), None, True,
                           AugmentConfig(crop_scale=(0.08, 1.0)), 0)
    count = min(args.count, len(dataset))
    stages(dataset, min(100, count))  # warm: page cache, imports
    figures = stages(dataset, count)
    buffers = args.loader == "buffers"
    if buffers:  # the resize or flip writes into the batch buffer: no stacking copy
        figures.pop("into the batch")
    figures["to the training process"] = transport(50 * BATCH, buffers)
    total = sum(figures.values())
    print(f"data_stages: {packed}, {count} images, crop {SIZE} + flip, batch {BATCH}, "
          f"{args.loader} loader, torch {torch.__version__}")
    print(f"{'stage':<30}{'ms/image':>10}{'share':>8}")
    for name, value in figures.items():
        print(f"{name:<30}{value:>10.3f}{value / total:>8.0%}")
    print(f"{'total':<30}{total:>10.3f}{1:>8.0%}")
    print(f"one core: {1e3 / total:.0f} img/s; decode alone: {1e3 / figures['decode']:.0f} "
          f"img/s; decode share {figures['decode'] / total:.2f}")


if __name__ == "__main__":
    main()
