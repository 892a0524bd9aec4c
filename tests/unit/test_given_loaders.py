"""DataLoaders where hpctrain expected Datasets (issue 53, items 2 and 4): the tests that need
no training run, no process and no server (the others are tests/runs/test_given_loaders.py,
tests/cluster/test_given_loaders.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch.utils.data import DataLoader


FIXTURE = Path(__file__).parent.parent / "fixtures" / "lit_classifier.py"
sys.path.insert(0, str(FIXTURE.parent))
from lit_classifier import blob_data  # noqa: E402


def test_a_batch_sampler_of_your_own_makes_every_batch_and_resumes_at_the_next():
    """A batch_sampler was refused (issue 53), and LightningLSTM's SequenceSampler, whose
    rows carry a hidden state from batch to batch, with it (issue 54): its batches are kept
    as it makes them (test_lightning.py trains the demo to Lightning's losses), a resume
    mid-epoch starts at the next one, and several processes, which cannot split them, are
    refused."""
    from types import SimpleNamespace

    from lightning.pytorch.demos import SequenceSampler

    from hpctrain.data.given_loaders import OwnBatches, settings_of
    from hpctrain.data.loader import _train_loader
    from hpctrain.errors import DataError

    data = blob_data(100, 0)
    loader = DataLoader(data, batch_sampler=SequenceSampler(data, 20))
    kept = settings_of(loader, "fit(train_data=...)")
    assert (kept.batch_size, kept.batch_sampler) == (20, loader.batch_sampler)
    assert "batches of its own SequenceSampler" in kept.describe()
    batches = OwnBatches(kept.batch_sampler, seed=0, batch_size=20)
    batches.set_epoch(1, start=2 * 20)  # two batches trained before the stop
    assert list(batches) == [list(batch) for batch in loader.batch_sampler][2:]
    assert len(batches) == 3
    with pytest.raises(DataError, match=r"batch_sampler \(SequenceSampler\) makes every "
                                        "batch, which hpctrain cannot split over 2 processes"):
        _train_loader(SimpleNamespace(bucketing=False), data, 20, 0,
                      {"rank": 0, "world_size": 2}, {}, kept)
