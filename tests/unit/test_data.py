"""Sampling, augmentation, ImageFolder discovery, bad images and the device batcher.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_data.py."""

import pytest
import torch

from hpctrain.config import AugmentConfig, DataConfig
from hpctrain.data.images.image_folders import ImageFolderDataset, scan_image_folder
from hpctrain.data.images.batcher import DeviceBatcher
from hpctrain.data.images.kind import image_size_for_epoch
from hpctrain.data.loader import build_datasets
from hpctrain.data.sampling import EpochSampler, SampleKey
from hpctrain.errors import DataError
from conftest import write_image_folder


def test_sampler_shuffles_per_epoch_and_resumes_at_a_position():
    sampler = EpochSampler(20, size=16, shuffle=True, seed=1)
    sampler.set_epoch(0, 16)
    first = [k.index for k in sampler]
    assert sorted(first) == list(range(20))
    sampler.set_epoch(1, 16)
    assert [k.index for k in sampler] != first
    sampler.set_epoch(0, 24, start=15)
    tail = list(sampler)
    assert [k.index for k in tail] == first[15:] and len(sampler) == 5
    assert all(k.epoch == 0 and k.size == 24 for k in tail)


def test_random_crops_differ_between_epochs(image_folder):
    _, samples = scan_image_folder(image_folder / "train")
    dataset = ImageFolderDataset(samples, True, AugmentConfig(), seed=0)
    a, _ = dataset[SampleKey(0, 0, 8)]
    b, _ = dataset[SampleKey(0, 1, 8)]
    assert not torch.equal(a, b)
    val = ImageFolderDataset(samples, False, AugmentConfig(), seed=0)
    assert torch.equal(val[SampleKey(0, 0, 8)][0], val[SampleKey(0, 1, 8)][0])


def test_progressive_resizing_grows_in_multiples():
    data = DataConfig(progressive={"enabled": True, "start_size": 160, "end_size": 192,
                                   "start_epoch": 2, "end_epoch": 6, "multiple_of": 16})
    sizes = [image_size_for_epoch(data, e) for e in range(8)]
    assert sizes[:3] == [160, 160, 160] and sizes[-2:] == [192, 192]
    assert sizes == sorted(sizes) and all(s % 16 == 0 for s in sizes)


def test_single_tree_is_split_by_val_fraction(tmp_path):
    write_image_folder(tmp_path / "flat", per_class=10)
    data = DataConfig(dataset="imagefolder", path=str(tmp_path / "flat"), val_fraction=0.2)
    train, val, num_classes = build_datasets(data, seed=0)
    assert num_classes == 2 and len(val) == 4 and len(train) == 16
    assert not {p for p, _ in train.samples} & {p for p, _ in val.samples}


@pytest.mark.parametrize("layout, message", [
    ("missing", "does not exist"),
    ("empty", "has no class sub-folders"),
    ("no_images", "but no image files"),
    ("no_val", "set data.val_fraction"),
    ("class_mismatch", "different class folders"),
])
def test_bad_folders_are_explained(tmp_path, layout, message):
    root = tmp_path / "data"
    if layout == "empty":
        root.mkdir()
    elif layout == "no_images":
        (root / "train" / "cat").mkdir(parents=True)
        (root / "train" / "cat" / "notes.txt").write_text("x")
    elif layout == "no_val":
        write_image_folder(root / "train")
    elif layout == "class_mismatch":
        write_image_folder(root / "train", classes=("cat", "dog"))
        write_image_folder(root / "val", classes=("cat", "cow"))
    data = DataConfig(dataset="imagefolder", path=str(root))
    with pytest.raises(DataError, match=message):
        build_datasets(data, seed=0)


def test_device_batcher_normalises_and_lays_out():
    batcher = DeviceBatcher(torch.device("cpu"), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), True)
    images = torch.full((2, 4, 4, 3), 255, dtype=torch.uint8)  # NHWC, as loaders give
    out, labels = batcher(images, torch.tensor([0, 1]))
    assert out.dtype == torch.float32
    assert torch.allclose(out, torch.full_like(out, 2.0))  # (1 - 0.5) / 0.25
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_auto_workers_share_the_node_among_its_processes(monkeypatch):
    """A 64-core node cannot run here: its core count is pretended."""
    from hpctrain.data import loader

    monkeypatch.setattr(loader, "usable_cpus", lambda: 64)
    assert loader.resolve_num_workers("auto") == 16  # capped
    assert loader.resolve_num_workers("auto", processes_per_node=8) == 7
    assert loader.resolve_num_workers("auto", processes_per_node=64) == 1
    assert loader.resolve_num_workers(3, processes_per_node=8) == 3
