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


def test_the_next_epoch_s_first_batches_are_made_during_the_evaluation(tmp_path, run_cli):
    """An epoch's end opens the next one before evaluating, so its workers make its first
    batches meanwhile: the next epoch's first step does not wait for them. (Each batch takes
    its worker 0.4 s here, the evaluation between the epochs 1.2 s; before, that first step
    waited its 0.4 s, 99 % of its interval.)"""
    import json

    from recipes import tensor_recipe

    recipe = tensor_recipe(tmp_path, "classification", "SignalNet", "slow_waves")
    code, _, err = run_cli("run", str(recipe), "data.kwargs={}", "data.num_workers=2",
                           "data.prefetch_factor=2", "train.batch_size=8", "train.epochs=2",
                           "train.log_every=1")
    assert code == 0, err
    records = [json.loads(line) for line in
               next((tmp_path / "runs").iterdir()).joinpath("metrics.jsonl").open()]
    waits = {r["step"]: r["data_wait_fraction"] * r["seconds_per_step"]  # seconds
             for r in records if r["kind"] == "train"}
    assert sorted(waits) == list(range(1, 9))
    assert waits[1] > 0.3  # the first epoch's first batch: nothing opened it ahead
    assert waits[5] < 0.1, waits


def test_validation_keeps_its_workers_between_evaluations_where_its_buffers_are_small(
        image_folder, monkeypatch):
    """Started again at each evaluation, a GPU node's 15 workers were most of a small
    evaluation; a large validation's buffers (ImageNet's: 4.5 GiB) are freed after each."""
    from hpctrain.data import loader

    data = DataConfig(dataset="imagefolder", path=str(image_folder), num_workers=2,
                      images={"image_size": 12})
    kept = build_data(data, batch_size=4, seed=5, device=torch.device("cpu")).val_loader
    assert kept.persistent_workers and kept.buffer_bytes <= loader.KEPT_VALIDATION_BUFFERS
    passes = [[labels.clone() for _, labels in kept] for _ in range(2)]
    workers = kept._workers.processes
    assert passes[0] and all(torch.equal(a, b) for a, b in zip(*passes))
    list(kept)  # a third pass: the same worker processes
    assert kept._workers.processes == workers and all(p.is_alive() for p in workers)
    kept.close()
    monkeypatch.setattr(loader, "KEPT_VALIDATION_BUFFERS", kept.buffer_bytes - 1)
    freed = build_data(data, batch_size=4, seed=5, device=torch.device("cpu")).val_loader
    assert not freed.persistent_workers
    list(freed)
    assert freed._workers is None  # stopped with the pass, its buffers freed
