"""Training and validation samples from packed shards (format: image_pack.py).

Decoding is cheaper than from files: the index holds every image's size, so the crop box is
drawn before decoding, and a JPEG whose crop is at least twice the output on each side is
decoded at 1/2, 1/4 or 1/8 scale by libjpeg-turbo's DCT scaling (the SIMD-accelerated factors;
the others measured slower than a full decode). The decoder is simplejpeg when installed
(`pip install hpctrain[jpeg]`, 25 % faster than PIL's decoding here), else PIL; both
are libjpeg-turbo (torchvision.io's CPU decoding is deprecated since torchvision 0.29).
Raw samples are a header and RGB bytes: no decoding at all.
"""

from __future__ import annotations

import functools
import io

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from hpctrain.data.images.image_folders import draw_view, render_view, skip_counter
from hpctrain.data.batch_buffers import ImageRows
from hpctrain.data.sampling import SampleKey
from hpctrain.data.images.image_pack import KIND_RAW, ShardReader, Split, raw_pixels
from hpctrain.data.images.settings import AugmentConfig
from hpctrain.errors import DataError


def dct_reduction(box: tuple[int, int, int, int], size: int) -> int:
    """The largest JPEG DCT scale-down (1, 2, 4 or 8) that still leaves the crop at least
    `size` pixels on each side, so the resize only ever shrinks."""
    width, height = box[2] - box[0], box[3] - box[1]
    for factor in (8, 4, 2):
        if width >= size * factor and height >= size * factor:
            return factor
    return 1


@functools.cache
def jpeg_decoder() -> str:
    """'simplejpeg' when it is installed, else 'pil'."""
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return "pil"
    return "simplejpeg"


def decode_jpeg(data, width: int, height: int, reduction: int = 1,
                decoder: str | None = None) -> np.ndarray:
    """JPEG bytes -> HWC uint8 RGB, at 1/`reduction` scale where the decoder can. The JPEG must
    be the `width` x `height` the index says (the pack check bounded those): a crafted header
    cannot make the decoder allocate more."""
    decoder = decoder or jpeg_decoder()
    if decoder == "simplejpeg":
        import simplejpeg
        scaled = {} if reduction == 1 else dict(min_height=-(-height // reduction),
                                                 min_width=-(-width // reduction))
        check_jpeg_size(data, width, height)
        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB", **scaled)
        except ValueError:  # a JPEG flavour simplejpeg refuses (CMYK, ...): PIL decodes it
            pass
    with Image.open(io.BytesIO(data)) as image:
        _same_size(image.size, width, height)
        if reduction > 1:
            image.draft("RGB", (-(-width // reduction), -(-height // reduction)))
        return np.asarray(image.convert("RGB"))


def check_jpeg_size(data, width: int, height: int) -> None:
    """A DataError unless the JPEG's header says `width` x `height` (read from the header
    alone: simplejpeg's, a few microseconds, else PIL's)."""
    if jpeg_decoder() == "simplejpeg":
        import simplejpeg
        try:
            real_height, real_width = simplejpeg.decode_jpeg_header(data)[:2]
            return _same_size((real_width, real_height), width, height)
        except ValueError:  # a header simplejpeg cannot read: PIL's word
            pass
    with Image.open(io.BytesIO(data)) as image:
        _same_size(image.size, width, height)


def _same_size(real: tuple[int, int], width: int, height: int) -> None:
    if tuple(real) != (width, height):
        raise DataError(f"a packed JPEG is {real[0]} x {real[1]} pixels where its index says "
                        f"{width} x {height}: the pack is damaged or was altered; re-pack it")


def stored_pixels(data, record, reduction: int = 1) -> np.ndarray:
    """One stored sample's pixels, HWC uint8: raw ones as they are, JPEGs decoded (at
    1/`reduction` scale where the decoder can)."""
    width, height = int(record["width"]), int(record["height"])
    if int(record["kind"]) == KIND_RAW:
        return raw_pixels(data, width, height)
    return decode_jpeg(data, width, height, reduction)


def decode_crop(data: memoryview, record, box: tuple[int, int, int, int], size: int,
                flip: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """One stored sample -> the `box` region resized to size x size, as uint8 HWC (written
    into `out` when given)."""
    width, height = int(record["width"]), int(record["height"])
    pixels = stored_pixels(data, record, dct_reduction(box, size))
    scale_x, scale_y = pixels.shape[1] / width, pixels.shape[0] / height
    box = (box[0] * scale_x, box[1] * scale_y, box[2] * scale_x, box[3] * scale_y)
    return render_view(pixels, box, size, flip, out)


class ShardDataset(ImageRows, Dataset):
    """The samples `rows` of a split (all when None), with the views `draw_view` draws, as
    ImageFolderDataset does."""

    def __init__(self, split: Split, rows: np.ndarray | None, train: bool,
                 augment: AugmentConfig, seed: int, val_resize_ratio: float = 1.0,
                 encoded: bool = False):
        self.encoded = encoded  # data.images.decode=gpu: leave the bytes to device_decode.py
        self.index_path = str(split.index.filename)
        self.rows = rows
        self.length = len(rows) if rows is not None else len(split.index)
        self.reader = ShardReader(split.shards)
        self.train, self.augment, self.seed = train, augment, seed
        self.val_resize_ratio = val_resize_ratio
        self.skipped = skip_counter()  # a pack holds no unreadable images
        self._index = None

    def __getstate__(self):
        return {**self.__dict__, "_index": None}  # each worker maps the index itself

    def __len__(self) -> int:
        return self.length

    def record(self, position: int):
        if self._index is None:
            self._index = np.load(self.index_path, mmap_mode="r")
        return self._index[self.rows[position] if self.rows is not None else position]

    def decode_full(self, position: int) -> np.ndarray:
        """The stored image at full size, nothing else: what `bench data` calls the decode
        limit."""
        record = self.record(position)
        return stored_pixels(self.reader.read(record), record)

    def _view(self, key: SampleKey):
        """(index record, crop box, flip) of one sample."""
        record = self.record(key.index)
        box, flip = draw_view(self.seed, key, int(record["width"]), int(record["height"]),
                              self.train, self.augment, self.val_resize_ratio)
        return record, box, flip

    def render_into(self, key: SampleKey, out: torch.Tensor) -> int:
        """The sample decoded, cropped, resized and flipped into `out` (a batch buffer's
        row: batch_buffers.py); its label."""
        record, box, flip = self._view(key)
        decode_crop(self.reader.read(record), record, box, key.size, flip, out)
        return int(record["label"])

    def __getitem__(self, key: SampleKey) -> tuple[torch.Tensor, int]:
        record, box, flip = self._view(key)
        width, height, kind = int(record["width"]), int(record["height"]), int(record["kind"])
        data = self.reader.read(record)
        if not self.encoded:
            return decode_crop(data, record, box, key.size, flip), int(record["label"])
        if kind == KIND_RAW:
            data = raw_pixels(data, width, height).reshape(-1)
        else:  # nvJPEG allocates what the header says: hold it to the index
            check_jpeg_size(data, width, height)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return (payload, kind, (width, height), box, flip, key.size), int(record["label"])
