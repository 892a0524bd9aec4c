"""Mixup and CutMix on the device batch: soft targets, an even batch, a training run.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_mixing.py."""


import numpy as np
import pytest
import torch

from hpctrain.config import AugmentConfig
from hpctrain.tasks.mixing import build_mixing
from hpctrain.errors import ConfigError


def test_mixing_blends_images_and_labels_into_soft_targets(seeded):
    mixing = build_mixing(AugmentConfig(mixup_alpha=0.4), 5, 0.1, 8)
    images = torch.arange(8.0).view(8, 1, 1, 1).expand(8, 3, 4, 4).clone()
    labels = torch.arange(8) % 5
    mixed, targets = mixing(images.clone(), labels)
    assert targets.shape == (8, 5) and torch.allclose(targets.sum(1), torch.ones(8))
    lam = (mixed[0, 0, 0, 0] - images[7, 0, 0, 0]) / (images[0, 0, 0, 0] - images[7, 0, 0, 0])
    assert 0 < lam < 1  # image 0 blended with its partner, image 7
    assert targets.min() > 0  # label smoothing reaches every class
    assert build_mixing(AugmentConfig(), 5, 0.0, 8) is None


def test_cutmix_pastes_a_box_and_an_odd_batch_is_refused():
    np.random.seed(0)  # timm draws from NumPy's generator
    mixing = build_mixing(AugmentConfig(cutmix_alpha=1.0), 3, 0.0, 4)
    images = torch.stack([torch.full((3, 16, 16), float(i)) for i in range(4)])
    mixed, targets = mixing(images.clone(), torch.tensor([0, 1, 2, 2]))
    assert set(mixed[0].unique().tolist()) == {0.0, 3.0}  # a box of its partner's pixels
    pasted = (mixed[0] == 3.0).float().mean().item()
    assert 0 < pasted < 1 and targets[0, 2].item() == pytest.approx(pasted)
    with pytest.raises(ConfigError, match="per-device batch must be even"):
        build_mixing(AugmentConfig(cutmix_alpha=1.0), 3, 0.0, 5)
