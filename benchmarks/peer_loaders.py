"""The data libraries users pick today, each writing and reading JPEG images the way its own
documentation recommends, for benchmarks/data_pipeline.py:

- LitData: `litdata.optimize` stores each sample's JPEG file as it is (its JPEG serializer
  keeps a PIL `JpegImageFile`'s file bytes) with its label; `StreamingDataset` +
  `StreamingDataLoader` read the chunks back, decoding with torchvision's `decode_jpeg`
  (LitData's own deserializer), then the transform.
- MosaicML Streaming: `MDSWriter` with a `jpeg` column (again the file's bytes) and an `int`
  label; `streaming.StreamingDataset` (local, shuffled) hands PIL images to the transform,
  through torch's DataLoader as its documentation shows.

Every loader crops with torchvision's RandomResizedCrop(224) and flips, to uint8, as the
other rows of data_pipeline.py do. MosaicML Streaming 0.13 pins numpy<2.2 and
transformers<5, which would downgrade hpctrain's test environment: it is installed on first
use into a folder of its own (`pip install --no-deps --target`, with the small codecs
it imports), put on sys.path by `streaming_library`, and runs on the installed numpy.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from hpctrain.data.images.image_folders import scan_image_folder

SIZE = 224
STREAMING = ["mosaicml-streaming==0.13.0", "brotli", "python-snappy", "cramjam", "zstd",
             "catalogue"]


def _litdata_sample(item: tuple[str, int]) -> dict:
    from PIL import Image
    path, label = item
    return {"image": Image.open(path), "label": label}


def build_litdata(folder: Path, out: Path, workers: int) -> float:
    """Seconds `litdata.optimize` takes to write `folder` as chunks of 64 MB."""
    import litdata

    started = time.perf_counter()
    litdata.optimize(fn=_litdata_sample, inputs=scan_image_folder(folder)[1], output_dir=str(out),
                     num_workers=workers, chunk_bytes="64MB", mode="overwrite",
                     start_method="fork")
    return time.perf_counter() - started


def _torchvision_transform(tensors: bool):
    from torchvision.transforms import v2
    steps = [v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()]
    return v2.Compose(steps if tensors else [*steps, v2.PILToTensor()])


class _LitTransform:
    """LitData hands the sample dict to `transform`: the image, cropped and flipped."""

    def __init__(self):
        self.crop = _torchvision_transform(tensors=True)

    def __call__(self, sample: dict) -> tuple:
        return self.crop(sample["image"]), sample["label"]


def litdata_loader(out: Path, workers: int, batch: int, cache: Path):
    from litdata import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(str(out), cache_dir=str(cache), shuffle=True, drop_last=True,
                               transform=_LitTransform())
    return StreamingDataLoader(dataset, batch_size=batch, num_workers=workers,
                               prefetch_factor=4, drop_last=True)


def streaming_library(target: Path) -> None:
    """Put MosaicML Streaming on sys.path, installing it into `target` once."""
    if not (target / "streaming").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--target", str(target), *STREAMING], check=True)
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))


def build_mds(folder: Path, out: Path) -> float:
    """Seconds MDSWriter takes to write `folder` with a `jpeg` column (one process: the
    writer has no workers of its own)."""
    from PIL import Image
    from streaming import MDSWriter

    started = time.perf_counter()
    with MDSWriter(out=str(out), columns={"image": "jpeg", "label": "int"},
                   size_limit="64mb", exist_ok=True) as writer:
        for path, label in scan_image_folder(folder)[1]:
            writer.write({"image": Image.open(path), "label": label})
    return time.perf_counter() - started


def streaming_loader(out: Path, workers: int, batch: int):
    import streaming
    from torch.utils.data import DataLoader

    transform = _torchvision_transform(tensors=False)

    class Cropped(streaming.StreamingDataset):
        def __getitem__(self, index: int):
            sample = super().__getitem__(index)
            return transform(sample["image"]), sample["label"]

    streaming.base.util.clean_stale_shared_memory()
    dataset = Cropped(local=str(out), shuffle=True, batch_size=batch)
    return DataLoader(dataset, batch_size=batch, num_workers=workers, drop_last=True,
                      prefetch_factor=4, persistent_workers=False)
