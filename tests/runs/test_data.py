"""Sampling, augmentation, ImageFolder discovery, bad images and the device batcher: the tests
that train, in this process or in an `hpctrain` process of their own (the others are
tests/unit/test_data.py)."""

import torch

from hpctrain.config import DataConfig
from hpctrain.data.loader import build_data


def test_augmentation_is_seeded_per_sample_not_per_worker(image_folder):
    data = DataConfig(dataset="imagefolder", path=str(image_folder),
                      images={"image_size": 12})
    batches = {}
    for workers in (0, 2):
        data.num_workers = workers
        bundle = build_data(data, batch_size=4, seed=5, device=torch.device("cpu"))
        bundle.train_sampler.set_epoch(3, 12)
        # a batch's buffer is reused two batches later (batch_buffers.py): kept as copies
        batches[workers] = [images.clone() for images, _ in bundle.train_loader]
    assert len(batches[0]) == len(batches[2]) == 6  # more than the 0-worker loader's 4 buffers
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[2]))
    assert batches[0][0].dtype == torch.uint8 and batches[0][0].shape == (4, 12, 12, 3)
