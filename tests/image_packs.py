"""Image packs the pack tests write and read: a small set of shards, a quiet packing, a flip of
a view."""

from pathlib import Path

import pytest

from hpctrain.data.images.image_packing import PackOptions, pack

SMALL_SHARDS = PackOptions(shard_bytes=4000)  # several shards from a few small images


def quiet(*_):
    pass


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def packed(image_folder, tmp_path) -> Path:
    dst = tmp_path / "packed"
    pack(image_folder, dst, SMALL_SHARDS, workers=2, log=quiet)
    return dst
