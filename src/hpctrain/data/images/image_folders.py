"""Datasets: image folders (the user's data and the built-in shapes) and synthetic tensors.

Samples leave the workers as uint8 HWC tensors: four times less to copy than float32, no
transposing copy on the CPU, and the layout the device wants for channels_last; conversion and
normalisation happen on the device as one batched operation (see loader.py). The crop is
resized by torch's vectorised uint8 antialiased bilinear kernel, four times faster than PIL's.
Augmentation draws from a generator seeded by (seed, epoch, index), never from global state.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from hpctrain.data.batch_buffers import ImageRows
from hpctrain.data.sampling import SampleKey
from hpctrain.data.images.settings import AugmentConfig
from hpctrain.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
MAX_CONSECUTIVE_BAD = 20


def scan_image_folder(folder: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted sub-folders) and (path, label) pairs of an ImageFolder tree."""
    if not folder.is_dir():
        raise DataError(f"data.path: folder {folder} does not exist; point data.path at an "
                        "ImageFolder tree (one sub-folder per class)")
    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir())
    if not classes:
        raise DataError(f"data.path: {folder} has no class sub-folders; expected "
                        f"{folder}/<class>/<image>.jpg")
    samples = []
    for label, name in enumerate(classes):
        for entry in sorted(os.scandir(folder / name), key=lambda e: e.name):
            # regular files only (through links): a FIFO named x.jpg would block a reader
            # forever, a link to /dev/zero would never end
            if entry.name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file():
                samples.append((entry.path, label))
    if not samples:
        raise DataError(f"data.path: {folder} has class folders ({', '.join(classes[:5])}"
                        f"{', ...' if len(classes) > 5 else ''}) but no image files in them "
                        f"(extensions {', '.join(IMAGE_EXTENSIONS)})")
    return classes, samples


def image_folder_splits(root: Path) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """Classes and (path, label) samples per split: 'train' and 'val' from train/ and val/
    (or validation/), or only 'train' for one tree of class folders."""
    if not (root / "train").is_dir():
        if not root.is_dir():
            raise DataError(f"data.path: folder {root} does not exist")
        classes, samples = scan_image_folder(root)
        return classes, {"train": samples}
    classes, train = scan_image_folder(root / "train")
    val_root = next((root / n for n in ("val", "validation") if (root / n).is_dir()), None)
    if val_root is None:
        return classes, {"train": train}
    val_classes, val = scan_image_folder(val_root)
    if val_classes != classes:
        differences = sorted(set(classes) ^ set(val_classes))[:5]
        raise DataError(f"data.path: {root}/train and {val_root} have different class "
                        f"folders (differences: {', '.join(differences)})")
    return classes, {"train": train, "val": val}


def crop_box(rng: random.Random, width: int, height: int,
             scale: tuple[float, float], ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """Random-resized-crop box (Inception style), drawn from `rng`."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left, top = rng.randint(0, width - w), rng.randint(0, height - h)
            return left, top, left + w, top + h
    side = min(width, height)  # fall back to a centre crop
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def center_box(width: int, height: int, fraction: float) -> tuple[int, int, int, int]:
    side = min(width, height) * fraction
    left, top = (width - side) / 2, (height - side) / 2
    return round(left), round(top), round(left + side), round(top + side)


def draw_view(seed: int, key: SampleKey, width: int, height: int, train: bool,
              augment: AugmentConfig, val_resize_ratio: float) -> tuple[tuple, bool]:
    """(crop box, flip) of one sample, drawn from (seed, epoch, index) alone: the same view
    whichever worker, loader or storage format renders it."""
    rng = random.Random(f"{seed}-{key.epoch}-{key.index}")
    if train and augment.random_resized_crop:
        box = crop_box(rng, width, height, augment.crop_scale)
    else:
        box = center_box(width, height, val_resize_ratio)
    return box, train and augment.hflip and rng.random() < 0.5


def crop_rows_columns(box: tuple) -> tuple[slice, slice]:
    """The rows and columns of a (left, top, right, bottom) box, at least one of each."""
    left, top, right, bottom = (round(v) for v in box)
    return slice(top, max(bottom, top + 1)), slice(left, max(right, left + 1))


def skip_counter():
    """A count of skipped images shared with the loader's workers, however they start: made
    in a spawn context, whose locks fork and forkserver workers may take too (one made in
    the default fork context cannot reach a spawned worker)."""
    return multiprocessing.get_context("spawn").Value("i", 0)


def render_view(pixels: np.ndarray, box: tuple, size: int, flip: bool,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """The `box` region of HWC uint8 `pixels` resized to size x size (and flipped), as uint8
    HWC. The crop is copied once, to a contiguous array that is already channels_last. With
    `out` (a size x size x 3 row of a batch buffer: batch_buffers.py) the last step writes
    into it, bit for bit what is returned without."""
    crop = np.array(pixels[crop_rows_columns(box)], copy=True)
    image = torch.from_numpy(crop)[None].permute(0, 3, 1, 2)  # NCHW view, channels_last
    if image.shape[-2:] != (size, size):  # keeps channels_last: the fast uint8 kernel
        if out is not None and not flip:
            torch.ops.aten._upsample_bilinear2d_aa.out(
                image, [size, size], False, None, None, out=out[None].permute(0, 3, 1, 2))
            return out
        image = F.interpolate(image, size=(size, size), mode="bilinear", antialias=True,
                              align_corners=False)
    image = image[0].permute(1, 2, 0)
    if out is None:
        return image.flip(1) if flip else image
    return torch.ops.aten.flip.out(image, [1], out=out) if flip else out.copy_(image)


class ImageFolderDataset(ImageRows, Dataset):
    """Decode, crop and flip one image; unreadable files are skipped or fatal by config."""

    def __init__(self, samples: list[tuple[str, int]], train: bool, augment: AugmentConfig,
                 seed: int, val_resize_ratio: float = 1.0, on_bad_image: str = "skip"):
        self.samples = samples
        self.train = train
        self.augment = augment
        self.seed = seed
        self.val_resize_ratio = val_resize_ratio
        self.on_bad_image = on_bad_image
        self.skipped = skip_counter()  # shared with the workers
        self._reported: set[str] = set()

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, path: str) -> np.ndarray:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))

    def decode_full(self, position: int) -> np.ndarray:
        """The image file decoded at full size, nothing else (`bench data`'s decode limit)."""
        return self._load(self.samples[position][0])

    def __getitem__(self, key: SampleKey) -> tuple[torch.Tensor, int]:
        return self._render(key, None)

    def render_into(self, key: SampleKey, out: torch.Tensor) -> int:
        """The sample written into `out` (a batch buffer's row); its label."""
        return self._render(key, out)[1]

    def _render(self, key: SampleKey, out: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        for attempt in range(MAX_CONSECUTIVE_BAD):
            index = (key.index + attempt) % len(self.samples)
            path, label = self.samples[index]
            try:
                pixels = self._load(path)
            except (OSError, ValueError, Image.DecompressionBombError) as err:
                if self.on_bad_image == "fail":
                    raise DataError(f"unreadable image {path}: {err}. Remove or replace it, "
                                    "or set data.images.on_bad_image=skip") from None
                self._report_skip(path, err)
                continue
            height, width = pixels.shape[:2]
            box, flip = draw_view(self.seed, key._replace(index=index), width, height,
                                  self.train, self.augment, self.val_resize_ratio)
            return render_view(pixels, box, key.size, flip, out), label
        raise DataError(f"{MAX_CONSECUTIVE_BAD} unreadable images in a row from "
                        f"{self.samples[key.index][0]}: is the dataset corrupt?")

    def _report_skip(self, path: str, err: Exception) -> None:
        with self.skipped.get_lock():
            self.skipped.value += 1
        if path not in self._reported:
            self._reported.add(path)
            print(f"hpctrain: skipping unreadable image {path} ({err})", file=sys.stderr)


class SyntheticDataset(Dataset):
    """Random uint8 images for pure-throughput work: a small pool reused, so no CPU cost."""

    POOL = 64

    def __init__(self, num_samples: int, num_classes: int, seed: int):
        self.num_samples = num_samples
        self.num_classes = num_classes
        self.seed = seed
        self._pools: dict[int, torch.Tensor] = {}
        self.skipped = skip_counter()

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, key: SampleKey) -> tuple[torch.Tensor, int]:
        pool = self._pools.get(key.size)
        if pool is None:
            generator = torch.Generator().manual_seed(self.seed)
            pool = torch.randint(0, 256, (self.POOL, key.size, key.size, 3),
                                 dtype=torch.uint8, generator=generator)
            self._pools[key.size] = pool
        return pool[key.index % self.POOL], key.index % self.num_classes
