"""Build the train and validation DataLoaders from the recipe's data section (`data`: a
settings.DataConfig, not imported here: the kinds' specs that it is made of import this
module), asking the data's kind (`data.kind_spec`) for its datasets, loaders and collation.

Loader policy: workers sized to the cores (auto), pinned memory on GPU so host-to-device copies
are asynchronous, persistent workers (no re-fork each epoch), a deep prefetch, drop_last for
training. Image batches stay uint8 NHWC until images' `DeviceBatcher` moves them to the
device and normalises them there in one batched operation.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

from hpctrain.data import batching
from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.given_loaders import LoaderSettings, OwnBatches, SharedSampler, kept_notes
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.streams import Stream
from hpctrain.data.tokens.sequences import LengthBucketSampler
from hpctrain.data.user_datasets import data_module_of, loader_settings, user_datasets
from hpctrain.data.worker_signals import SignalSafeLoader
from hpctrain.data.worker_start import start_method
from hpctrain.errors import ConfigError, DataError, DeviceError

# validation's batch buffers up to this size are kept between evaluations with their workers
# (the default recipe's: 63 slots of 256 images of 32 px, 47 MiB on a 16-core node); an
# ImageNet validation's (63 slots of 512 images of 224 px, 4.5 GiB) are freed after each
KEPT_VALIDATION_BUFFERS = 512 << 20


@dataclass
class DataBundle:
    train_loader: SignalSafeLoader | BufferedLoader
    train_sampler: EpochSampler | LengthBucketSampler | Stream  # each has set_epoch
    val_loader: SignalSafeLoader | BufferedLoader
    val_sampler: EpochSampler
    num_classes: int | None  # images
    num_workers: int
    vocab_size: int | None = None  # tokens
    answer: tuple[int, int] | None = None  # tokens: the ids around graded answers
    classes_from: str | None = None  # where num_classes came from, if not the recipe or data
    collate: Callable = default_collate  # what the loaders batch samples with
    notes: tuple[str, ...] = ()  # what the banner says of the batches (bucketing's padding)
    data_module: object | None = None  # the LightningDataModule they came from, if any

    def close(self) -> None:
        """Stop both loaders' workers (a next pass starts them again)."""
        self.train_loader.close()
        self.val_loader.close()

    @property
    def skipped_images(self) -> int:
        return sum(dataset.skipped.value for dataset in
                   (self.train_loader.dataset, self.val_loader.dataset)
                   if hasattr(dataset, "skipped"))


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_num_workers(setting: int | str, processes_per_node: int = 1) -> int:
    """auto: this process's share of the node's cores, less one for the training process
    itself, at most 16 (8 GPU processes on a 64-core node get 7 workers each, not 63)."""
    if setting != "auto":
        return int(setting)
    return max(1, min(16, usable_cpus() // processes_per_node - 1))


def val_batch_size(data, batch_size: int) -> int:
    """Samples per device in an evaluation batch: data.val_batch_size, else twice the training
    batch (evaluation holds no gradients)."""
    return data.val_batch_size or batch_size * 2


def build_datasets(data, seed: int, rank: int = 0, scratch: Path | None = None) \
        -> tuple[Dataset, Dataset, int]:
    """(train, val, number of classes, or a token kind's vocabulary) of data.dataset; `rank`:
    the data-parallel rank (your own datasets' workers seed from it); `scratch`: the job's
    node-local folder (data.images.cache=auto)."""
    if data.from_user_code:
        return user_datasets(data, seed, rank)
    return data.kind_spec.datasets_of(data, seed, rank, scratch)


def build_data(data, batch_size: int, seed: int, device: torch.device,
               rank: int = 0, world_size: int = 1, processes_per_node: int = 1,
               stop_signals: tuple[str, ...] = ("SIGUSR1",),
               scratch: Path | None = None) -> DataBundle:
    """Loaders for this rank's share of the data (see `EpochSampler`), the kind's own where
    it has them, keeping what your DataLoaders set (given_loaders.py); their workers leave
    SIGTERM and `stop_signals` to the training process (worker_signals.py). `scratch`: the
    job's node-local folder (data.images.cache=auto)."""
    if data.images.decode == "gpu" and device.type != "cuda":
        raise DeviceError(f"data.images.decode=gpu decodes with nvJPEG on a CUDA device, but this "
                          f"run is on {device}: set data.images.decode=cpu")
    workers = resolve_num_workers(data.num_workers, processes_per_node)
    common = _loader_options(data, device, workers, seed, stop_signals)
    kind = data.kind_spec
    own = kind.loaders(data, batch_size, seed, rank, world_size, {**common, **_started(
        data, workers, stop_signals)[0]})  # hpctrain's own datasets: they ship to any worker
    if own is not None:
        return own
    train_set, val_set, num_classes = build_datasets(data, seed, rank, scratch)
    # your own token data: blocks of ids, stacked; the third figure is the vocabulary
    num_classes, vocab_size = (None, num_classes) if kind.vocabulary else (num_classes, None)
    given, given_val = loader_settings(data, seed) if data.from_user_code else (None, None)
    if given is not None and workers > 0:  # your workers' own start
        common["worker_init_fn"] = given.worker_init_fn
        if given.start_method and data.worker_start == "auto":
            common["multiprocessing_context"] = given.start_method
    forked_why = None
    if "multiprocessing_context" not in common:  # (your DataLoader's own start is kept)
        started, forked_why = _started(data, workers, stop_signals, train_set, val_set,
                                       common.get("worker_init_fn"), given and given.collate,
                                       given_val and given_val.collate)
        common.update(started)
    shard = dict(rank=rank, world_size=world_size)
    val_size = data.kind_spec.key_size(data, None)
    val_sampler = EpochSampler(len(val_set), val_size, shuffle=False, pad=True, **shard)
    val_batch = val_batch_size(data, batch_size)
    val_loader = sample_loader(
        data, val_set, val_sampler, val_batch, given_val is not None and given_val.drop_last,
        val_size, {**common, "collate_fn": batching.collate_for(data, given_val or given)},
        between_passes=False)
    common["collate_fn"] = batching.collate_for(data, given)
    bundle = functools.partial(
        DataBundle, val_loader=val_loader, val_sampler=val_sampler, num_classes=num_classes,
        num_workers=workers, vocab_size=vocab_size,
        collate=common["collate_fn"] or default_collate,
        notes=kept_notes(given, given_val, batch_size, val_batch, world_size) + (
            (f"workers start by fork: {forked_why}",) if forked_why else ()),
        data_module=data_module_of(data, seed) if data.from_user_code else None)
    if isinstance(train_set, IterableDataset):  # your own stream (streams.py)
        stream = Stream(train_set, data.dataset, rank, world_size, batch_size, seed)
        # fresh workers each epoch: they take the stream's epoch and skip with them
        train_loader = SignalSafeLoader(stream, batch_size=batch_size, drop_last=True,
                                        **{**common, "persistent_workers": False})
        return bundle(train_loader, stream)
    train_loader, train_sampler, notes = _train_loader(data, train_set, batch_size, seed,
                                                       shard, common, given)
    made = bundle(train_loader, train_sampler)
    return dataclasses.replace(made, notes=made.notes + notes)


def _loader_options(data, device: torch.device, workers: int, seed: int,
                    stop_signals: tuple[str, ...]) -> dict:
    """What every loader of the run is made with: workers, pinned memory, their stop
    signals and their generator."""
    pin = device.type == "cuda" if data.pin_memory == "auto" else data.pin_memory
    # the loaders' own generator: making an iterator draws a seed for its workers, which from
    # torch's global generator would shift the draws of dropout and device augmentation when a
    # resumed run makes its iterator at another moment than the uninterrupted one did
    common = dict(num_workers=workers, pin_memory=pin, stop_signals=stop_signals,
                  generator=torch.Generator().manual_seed(seed))
    if workers > 0:
        common.update(persistent_workers=data.persistent_workers,
                      prefetch_factor=data.prefetch_factor)
    return common


def _started(data, workers: int, stop_signals: tuple[str, ...], *given) \
        -> tuple[dict, str | None]:
    """The loaders' start method (worker_start.py) as their options, for the workers to be
    handed `given`; and why `auto` forks, where it does."""
    if workers == 0:
        return {}, None
    method, forked_why = start_method(data.worker_start, stop_signals, *given)
    return {"multiprocessing_context": method}, forked_why


def _train_loader(data, train_set: Dataset, batch_size: int, seed: int, shard: dict,
                  common: dict, given: LoaderSettings | None) -> tuple:
    """(loader, sampler, what the banner says of it) of a map-style training set: batched by
    length (data.bucketing), in your DataLoader's order (its own sampler, shuffled or in
    order), else shuffled by hpctrain's sampler."""
    drop_last = given.drop_last if given is not None else True
    if drop_last and len(train_set) < batch_size * shard["world_size"]:
        raise DataError(f"the training set has {len(train_set)} samples, fewer than one batch "
                        f"(train.batch_size={batch_size} x {shard['world_size']} processes); "
                        "lower the batch size")
    if data.bucketing:  # your own samples of different lengths, batched by length
        if batching.yours(data, given) is None:
            raise ConfigError("data.bucketing batches samples of different lengths, which "
                              "need a collate function that pads them: set data.collate (or "
                              "your DataLoader's collate_fn)")
        sampler = LengthBucketSampler(
            batching.lengths_of(train_set.dataset, data.dataset, shard["rank"]), batch_size,
            seed=seed, keyed=True, drop_last=drop_last, **shard)
        return SignalSafeLoader(train_set, batch_sampler=sampler, **common), sampler, \
            (bucketing_note(sampler),)
    if given is not None and given.batch_sampler is not None:  # it makes the batches
        if shard["world_size"] > 1:
            raise DataError(f"your DataLoader's batch_sampler "
                            f"({type(given.batch_sampler).__name__}) makes every batch, which "
                            f"hpctrain cannot split over {shard['world_size']} processes (nor "
                            "can Lightning); train on one process, or give the DataLoader a "
                            "batch_size and a sampler")
        if batch_size != given.batch_size:
            raise DataError(f"train.batch_size {batch_size}: your DataLoader's batch_sampler "
                            f"({type(given.batch_sampler).__name__}) makes batches of "
                            f"{given.batch_size}; leave train.batch_size unset")
        sampler = OwnBatches(given.batch_sampler, seed, batch_size)
        return SignalSafeLoader(train_set, batch_sampler=sampler, **common), sampler, ()
    if given is not None and given.sampler is not None:  # drawn alike on every rank
        sampler = SharedSampler(given.sampler, seed, **shard)
        return SignalSafeLoader(train_set, batch_size=batch_size, sampler=sampler,
                                drop_last=drop_last, **common), sampler, ()
    sampler = EpochSampler(len(train_set), data.kind_spec.key_size(data, 0), seed=seed,
                           shuffle=given.shuffle if given is not None else True, **shard)
    largest = max(data.kind_spec.image_sizes(data), default=0)  # images' only
    return sample_loader(data, train_set, sampler, batch_size, drop_last, largest, common,
                         between_passes=True), sampler, ()


def bucketing_note(sampler: LengthBucketSampler) -> str:
    """The padding an epoch's batches by length carry, and what random batches would."""
    random = LengthBucketSampler(sampler.lengths, sampler.batch_size, pool_batches=1,
                                 seed=sampler.seed)
    return (f"data.bucketing: batches of similar lengths, {sampler.padding_fraction():.1%} of "
            f"the positions padding (random batches: {random.padding_fraction():.1%})")


def uses_buffers(data, dataset: Dataset) -> bool:
    """Whether data.loader means batch buffers for this dataset; a ConfigError for
    data.loader=buffers where the dataset cannot render into them."""
    renders = hasattr(dataset, "render_rows") and data.images.decode == "cpu"
    if data.loader == "buffers" and not renders:
        raise ConfigError(f"data.loader=buffers: data.dataset={data.dataset} with "
                          f"data.images.decode={data.images.decode} does not render into batch "
                          "buffers (packs and image folders decoded on the CPU and the blocks of "
                          "a token pack do); use data.loader=auto")
    return renders and data.loader != "torch"


def sample_loader(data, dataset: Dataset, sampler: EpochSampler, batch_size: int,
                  drop_last: bool, largest: int, common: dict, between_passes: bool):
    """Batch buffers (batch_buffers.py) where the dataset renders into them, else torch's
    DataLoader; `largest`: the largest sample size the sampler will ask for. Batch buffers
    and their workers are kept from pass to pass (with data.persistent_workers) for training,
    and for validation where its buffers, twice as large, take at most
    KEPT_VALIDATION_BUFFERS: else they are freed after each evaluation and its workers
    started again at the next (on a GPU node's 15 workers, most of a small evaluation)."""
    if not uses_buffers(data, dataset):
        return SignalSafeLoader(dataset, batch_size=batch_size, sampler=sampler,
                                drop_last=drop_last, **common)
    loader = BufferedLoader(dataset, sampler, batch_size, drop_last, common["num_workers"],
                            largest, prefetch_factor=common.get("prefetch_factor", 1),
                            persistent_workers=common.get("persistent_workers", True),
                            stop_signals=common["stop_signals"],
                            context=common.get("multiprocessing_context"),
                            pin=common["pin_memory"])
    if not between_passes and loader.buffer_bytes > KEPT_VALIDATION_BUFFERS:
        loader.persistent_workers = False
    return loader
