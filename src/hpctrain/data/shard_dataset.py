"""Training and validation samples from packed shards (format: shards.py).

Decoding is cheaper than from files: the crop box is drawn before decoding (the index holds
every image's size), so a JPEG whose crop is much larger than the output is decoded at 1/2,
1/4 or 1/8 scale by libjpeg-turbo's DCT scaling (PIL's `draft`), and only the crop is resized.
Raw samples are a header and RGB bytes: no decoding at all.
"""

from __future__ import annotations

import io
import multiprocessing
import random

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from hpctrain.config import AugmentConfig
from hpctrain.data.datasets import center_box, crop_box, to_chw_uint8
from hpctrain.data.sampling import SampleKey
from hpctrain.data.shards import KIND_RAW, ShardReader, Split, ppm_header


def dct_reduction(box: tuple[int, int, int, int], size: int) -> int:
    """The largest JPEG DCT scale-down (1, 2, 4 or 8) that still leaves the crop at least
    `size` pixels on each side, so the resize only ever shrinks."""
    width, height = box[2] - box[0], box[3] - box[1]
    for factor in (8, 4, 2):
        if width >= size * factor and height >= size * factor:
            return factor
    return 1


def decode_crop(data: memoryview, record, box: tuple[int, int, int, int], size: int,
                flip: bool) -> torch.Tensor:
    """One stored sample -> the `box` region resized to size x size, as uint8 CHW."""
    width, height = int(record["width"]), int(record["height"])
    if int(record["kind"]) == KIND_RAW:
        pixels = np.frombuffer(data, np.uint8, offset=len(ppm_header(width, height)))
        image = Image.fromarray(pixels.reshape(height, width, 3))
    else:
        image = Image.open(io.BytesIO(data))
        factor = dct_reduction(box, size)
        if factor > 1:
            image.draft("RGB", (-(-width // factor), -(-height // factor)))
        scale_x, scale_y = image.size[0] / width, image.size[1] / height
        box = (box[0] * scale_x, box[1] * scale_y, box[2] * scale_x, box[3] * scale_y)
    image = image.resize((size, size), Image.BILINEAR, box=box)
    if flip:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return to_chw_uint8(image)


class ShardDataset(Dataset):
    """The samples `rows` of a split (all when None), augmented as ImageFolderDataset does:
    the same seeded crop and flip for the same (seed, epoch, index)."""

    def __init__(self, split: Split, rows: np.ndarray | None, train: bool,
                 augment: AugmentConfig, seed: int, val_resize_ratio: float = 1.0):
        self.index_path = str(split.index.filename)
        self.rows = rows
        self.length = len(rows) if rows is not None else len(split.index)
        self.reader = ShardReader(split.shards)
        self.train, self.augment, self.seed = train, augment, seed
        self.val_resize_ratio = val_resize_ratio
        self.skipped = multiprocessing.Value("i", 0)  # a pack holds no unreadable images
        self._index = None

    def __getstate__(self):
        return {**self.__dict__, "_index": None}  # each worker maps the index itself

    def __len__(self) -> int:
        return self.length

    def record(self, position: int):
        if self._index is None:
            self._index = np.load(self.index_path, mmap_mode="r")
        return self._index[self.rows[position] if self.rows is not None else position]

    def labels(self) -> np.ndarray:
        labels = np.load(self.index_path, mmap_mode="r")["label"]
        return np.asarray(labels[self.rows] if self.rows is not None else labels)

    def __getitem__(self, key: SampleKey) -> tuple[torch.Tensor, int]:
        record = self.record(key.index)
        rng = random.Random(f"{self.seed}-{key.epoch}-{key.index}")
        width, height = int(record["width"]), int(record["height"])
        if self.train and self.augment.random_resized_crop:
            box = crop_box(rng, width, height, self.augment.crop_scale)
        else:
            box = center_box(width, height, self.val_resize_ratio)
        flip = self.train and self.augment.hflip and rng.random() < 0.5
        image = decode_crop(self.reader.read(record), record, box, key.size, flip)
        return image, int(record["label"])
