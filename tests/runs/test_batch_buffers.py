"""data.loader=buffers: workers write samples straight into shared batch buffers. Its batches
are torch DataLoader's to the bit (same samples, crops and flips) for JPEG, raw and mixed
packs, with 0, 1 and 2 workers, on either of 2 ranks, across epochs of changing size; a
worker killed mid-epoch is a clear error within seconds; a worker's error reaches the
training process; a pass left early does not spoil the next."""

import os
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader

from hpctrain.config import AugmentConfig
from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.images.image_pack_dataset import ShardDataset
from hpctrain.data.images.image_pack import Pack
from hpctrain.errors import DataError, DataPipelineFailed

STORES = {"jpeg": PackOptions(shard_bytes=4000),
          "raw": PackOptions(store="raw", shard_bytes=4000),
          "mixed": PackOptions(store="auto", raw_max_side=0, raw_fraction=0.5,
                               shard_bytes=4000)}


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    from conftest import write_image_folder

    root = tmp_path_factory.mktemp("buffers")
    write_image_folder(root / "images" / "train", classes=("a", "b", "c"), per_class=10,
                       size=40)
    write_image_folder(root / "images" / "val", classes=("a", "b", "c"), per_class=3, size=40)
    for name, options in STORES.items():
        pack(root / "images", root / name, options, workers=1, log=lambda *_: None)
    return root


def _dataset(packs, store: str, split: str = "train") -> ShardDataset:
    return ShardDataset(Pack(packs / store).split(split), None, split == "train",
                        AugmentConfig(), seed=3)


def _batches(loader, sampler, epochs) -> list:
    """Every batch of the given (epoch, size) passes, copied (a buffer is reused later)."""
    seen = []
    for epoch, size in epochs:
        sampler.set_epoch(epoch, size)
        seen += [(images.clone(), labels.clone()) for images, labels in loader]
    return seen


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("rank", [0, 1])
def test_the_batches_are_torch_dataloaders_to_the_bit(packs, store, workers, rank):
    dataset = _dataset(packs, store)
    epochs = [(0, 24), (1, 24), (2, 32)]  # progressive resizing: a larger last epoch
    torch_sampler, sampler = (EpochSampler(len(dataset), 24, shuffle=True, seed=7, rank=rank,
                                           world_size=2) for _ in range(2))
    expected = _batches(DataLoader(dataset, batch_size=4, sampler=torch_sampler,
                                   num_workers=workers, drop_last=True), torch_sampler, epochs)
    loader = BufferedLoader(dataset, sampler, 4, True, workers, max_size=32,
                            prefetch_factor=1)
    got = _batches(loader, sampler, epochs)
    assert len(got) == len(expected) == 3 * (15 // 4)
    for (images, labels), (twin, twin_labels) in zip(got, expected):
        assert torch.equal(labels, twin_labels) and torch.equal(images, twin)
    loader.close()


def test_validation_batches_keep_the_last_short_batch(packs):
    dataset = _dataset(packs, "mixed", "val")
    sampler = EpochSampler(len(dataset), 24, shuffle=False, pad=True)
    expected = list(DataLoader(dataset, batch_size=4, sampler=sampler))
    got = _batches(BufferedLoader(dataset, sampler, 4, False, 2, max_size=24), sampler,
                   [(0, 24)])
    assert [len(labels) for _, labels in got] == [4, 4, 1]
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, expected))


def test_a_pass_left_early_does_not_spoil_the_next(packs):
    dataset = _dataset(packs, "jpeg")
    sampler = EpochSampler(len(dataset), 24, shuffle=True)
    loader = BufferedLoader(dataset, sampler, 4, True, 2, max_size=24, prefetch_factor=2)
    next(iter(loader))  # the rest of this pass is in flight, then abandoned
    expected = list(DataLoader(dataset, batch_size=4, sampler=sampler, drop_last=True))
    assert all(torch.equal(a, c) and torch.equal(b, d)
               for (a, b), (c, d) in zip(_batches(loader, sampler, [(0, 24)]), expected))
    loader.close()


class _SlowRendering(ShardDataset):
    """A pack whose batches take 0.4 s each to render."""

    def render_rows(self, keys, rows):
        time.sleep(0.4)
        return super().render_rows(keys, rows)


def test_a_pass_renders_from_when_it_is_opened_and_spares_the_last_pass_s_batches(packs):
    """The loop opens the next epoch before the evaluation between them: its first batch
    is rendered meanwhile. The last batches of the pass before, which the step may still be
    reading (or copying to the GPU from), are not written over by it."""
    split = Pack(packs / "jpeg").split("train")
    dataset = _SlowRendering(split, None, True, AugmentConfig(), seed=3)
    sampler = EpochSampler(len(dataset), 24, shuffle=True)
    loader = BufferedLoader(dataset, sampler, 4, True, 2, max_size=24, prefetch_factor=1)
    last = None
    for last in loader:  # the pass's last batch, in its buffer (not copied)
        pass
    kept = (last[0].clone(), last[1].clone())
    sampler.set_epoch(1, 24)
    opened = iter(loader)  # the next pass, opened as an evaluation begins
    time.sleep(1.5)  # the evaluation
    started = time.monotonic()
    first = next(opened)
    assert time.monotonic() - started < 0.3  # rendered meanwhile: 0.4 s a batch otherwise
    assert torch.equal(last[0], kept[0])  # the new pass wrote elsewhere
    expected = next(iter(DataLoader(dataset, batch_size=4, sampler=sampler, drop_last=True)))
    assert torch.equal(first[0], expected[0]) and torch.equal(first[1], expected[1])
    loader.close()


def test_a_worker_killed_mid_epoch_is_named_not_waited_for(packs):
    dataset = _dataset(packs, "jpeg")
    sampler = EpochSampler(len(dataset), 24, shuffle=True)
    loader = BufferedLoader(dataset, sampler, 2, True, 2, max_size=24, prefetch_factor=1)
    batches = iter(loader)
    next(batches)
    victim = loader._workers.processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(DataPipelineFailed, match=rf"input worker \(pid {victim.pid}\) was "
                       "killed by SIGKILL while making batch"):
        for _ in batches:
            pass
    assert time.monotonic() - started < 15
    loader.close()


def test_a_workers_error_reaches_the_training_process(packs, tmp_path):
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(packs / "jpeg", damaged)
    split = Pack(damaged).split("train")
    record = split.index[0]
    with open(split.shards[int(record["shard"])], "r+b") as handle:
        handle.seek(int(record["offset"]) + 30)
        handle.write(b"\x00\x01\x02")
    dataset = ShardDataset(Pack(damaged).split("train"), None, True, AugmentConfig(), 0)
    sampler = EpochSampler(len(dataset), 24, shuffle=False)
    with pytest.raises(DataError, match="is corrupted.*CRC-32"):
        list(BufferedLoader(dataset, sampler, 4, True, 2, max_size=24))


def test_spawned_workers_share_the_buffers_too(packs):
    """data.worker_start=spawn: the buffers reach the workers through torch's sharing of
    storages, not by inheritance. (Before, the datasets' skip counter, made in the fork
    context, stopped spawned workers of torch's DataLoader as well.)"""
    dataset = _dataset(packs, "raw")
    sampler = EpochSampler(len(dataset), 24, shuffle=True)
    expected = _batches(DataLoader(dataset, batch_size=4, sampler=sampler, drop_last=True,
                                   num_workers=1, multiprocessing_context="spawn"),
                        sampler, [(0, 24)])
    loader = BufferedLoader(dataset, sampler, 4, True, 1, max_size=24, context="spawn")
    got = _batches(loader, sampler, [(0, 24)])
    assert len(got) == len(expected) and all(
        torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(got, expected))
    loader.close()


def test_buffers_asked_for_a_dataset_that_cannot_render_into_them_is_exit_2(run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny("data.dataset=synthetic",
                                                   "data.loader=buffers"))
    assert code == 2 and "data.loader=buffers: data.dataset=synthetic" in err
    assert "use data.loader=auto" in err and "Traceback" not in err
