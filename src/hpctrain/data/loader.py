"""Build the train and validation DataLoaders from the data section of a Config.

Loader policy: workers sized to the cores (auto), pinned memory on GPU so host-to-device copies
are asynchronous, persistent workers (no re-fork each epoch), a deep prefetch, drop_last for
training. Batches stay uint8 NHWC until `DeviceBatcher` moves them to the device and normalises
them there in one batched operation.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hpctrain.config import DataConfig
from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.images.image_folders import (ImageFolderDataset, SyntheticDataset,
                                                image_folder_splits)
from hpctrain.data.images.device_decode import EncodedBatch, collate_encoded, decode_batch
from hpctrain.data.points.modelnet import PointSplits, read_modelnet
from hpctrain.data.points.modelnet import classes as modelnet_classes
from hpctrain.data.points.modelnet import layout as modelnet_layout
from hpctrain.data.node_cache import node_local_pack
from hpctrain.data.points.clouds import PointClouds
from hpctrain.data.tokens.arithmetic import ANSWER_START, ensure_arithmetic
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.tokens.sequences import LengthBucketSampler
from hpctrain.data.images.image_pack_dataset import ShardDataset
from hpctrain.data.streams import Stream
from hpctrain.data.images.image_pack import Pack
from hpctrain.data.images.shapes import CLASSES as SHAPE_CLASSES
from hpctrain.data.images.shapes import ensure_shapes
from hpctrain.data.points.shapes3d import CLASSES as SHAPES3D_CLASSES
from hpctrain.data.points.shapes3d import ensure_shapes3d
from hpctrain.data.tokens.token_pack import TokenBlocks, TokenDocuments, TokenPack, pad_documents
from hpctrain.data.user_datasets import user_datasets
from hpctrain.data.worker_signals import SignalSafeLoader
from hpctrain.errors import ConfigError, DataError, DeviceError


@dataclass
class DataBundle:
    train_loader: DataLoader
    train_sampler: EpochSampler | LengthBucketSampler | Stream  # each has set_epoch
    val_loader: DataLoader
    val_sampler: EpochSampler
    num_classes: int | None  # images
    num_workers: int
    vocab_size: int | None = None  # tokens
    answer: tuple[int, int] | None = None  # tokens: the ids around graded answers
    classes_from: str | None = None  # where num_classes came from, if not the recipe or data

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


def image_size_for_epoch(data: DataConfig, epoch: int) -> int:
    """The training resolution of `epoch`: fixed, or growing linearly (progressive resizing)."""
    p = data.progressive
    if not p.enabled:
        return data.image_size
    t = min(max((epoch - p.start_epoch) / max(p.end_epoch - p.start_epoch, 1), 0.0), 1.0)
    size = p.start_size + t * (p.end_size - p.start_size)
    return max(p.multiple_of, int(round(size / p.multiple_of)) * p.multiple_of)


def image_sizes(data: DataConfig) -> tuple[int, ...]:
    """Every image size a run feeds the model: training (each epoch's, under progressive
    resizing) and validation; none for tokens and points."""
    if data.kind != "images":
        return ()
    epochs = range(data.progressive.end_epoch + 1) if data.progressive.enabled else [0]
    return tuple(sorted({*(image_size_for_epoch(data, e) for e in epochs),
                         data.val_image_size or data.image_size}))


def hold_out(samples: list, fraction: float, seed: int) -> tuple[list, list]:
    """(kept, held out): `fraction` of `samples` (at least one) drawn by `seed`, the same on
    every rank and every restart; each part in the samples' order."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(len(samples) * fraction))
    val = sorted(order[:n_val])
    train = sorted(order[n_val:])
    return [samples[i] for i in train], [samples[i] for i in val]


def _image_folder_samples(root: Path, val_fraction: float | None, seed: int):
    """(num_classes, train samples, val samples) from train/ + val/, or one tree split."""
    classes, splits = image_folder_splits(root)
    if "val" in splits:
        return len(classes), splits["train"], splits["val"]
    if val_fraction is None:
        if (root / "train").is_dir():
            raise DataError(f"data.path: {root} has train/ but no val/ folder; add one or set "
                            "data.val_fraction=0.1 to hold out part of train/")
        raise DataError(f"data.path: {root} has no train/ and val/ folders; set "
                        "data.val_fraction=0.1 to hold out part of it for validation")
    return (len(classes), *hold_out(splits["train"], val_fraction, seed))


def build_datasets(data: DataConfig, seed: int, rank: int = 0) -> tuple[Dataset, Dataset, int]:
    """(train, val, number of classes) of data.dataset; `rank`: the data-parallel rank (your
    own datasets' workers seed from it)."""
    if data.from_user_code:
        return user_datasets(data, seed, rank)
    if data.dataset == "synthetic":
        s = data.synthetic
        return (SyntheticDataset(s.num_train, s.num_classes, seed),
                SyntheticDataset(s.num_val, s.num_classes, seed + 1), s.num_classes)
    if data.dataset == "shapes":
        s = data.shapes
        root = ensure_shapes(Path(s.cache_dir).expanduser(), s.seed, s.num_train, s.num_val,
                             s.image_size)
        num_classes, train, val = _image_folder_samples(root, None, seed)
        assert num_classes == len(SHAPE_CLASSES)
    elif data.dataset == "shards":
        return _check_classes(data, *_shard_datasets(data, seed))
    elif data.kind == "points":
        return _check_classes(data, *_point_datasets(data))
    else:
        num_classes, train, val = _image_folder_samples(Path(data.path).expanduser(),
                                                        data.val_fraction, seed)
    make = lambda samples, is_train: ImageFolderDataset(
        samples, is_train, data.augment, seed, data.val_resize_ratio, data.on_bad_image)
    return _check_classes(data, make(train, True), make(val, False), num_classes)


def _shard_datasets(data: DataConfig, seed: int) -> tuple[Dataset, Dataset, int]:
    """A pack's train and val splits; without a val split, data.val_fraction of train."""
    packed = node_local_pack(Pack(data.path), data.cache)
    train = packed.split("train")
    make = lambda split, rows, is_train: ShardDataset(split, rows, is_train, data.augment, seed,
                                                      data.val_resize_ratio,
                                                      encoded=data.decode == "gpu")
    if "val" in packed.splits:
        return (make(train, None, True), make(packed.split("val"), None, False),
                len(packed.classes))
    if data.val_fraction is None:
        raise DataError(f"data.path: pack {packed.root} has no val split; set "
                        "data.val_fraction=0.1 to hold out part of train, or pack a source "
                        "with train/ and val/")
    train_rows, val_rows = hold_out(list(range(len(train.index))), data.val_fraction, seed)
    return (make(train, np.array(train_rows), True), make(train, np.array(val_rows), False),
            len(packed.classes))


def point_splits(data: DataConfig) -> PointSplits:
    """The clouds of the built-in shapes3d (made on first use) or of ModelNet at data.path."""
    if data.dataset == "shapes3d":
        s = data.shapes3d
        folder = ensure_shapes3d(Path(s.cache_dir).expanduser(), s.seed, s.num_train,
                                 s.num_val, data.points.num_points)
        return PointSplits(list(SHAPES3D_CLASSES),
                           *({split: np.load(folder / f"{split}_{what}.npy", mmap_mode="r")
                              for split in ("train", "val")} for what in ("points", "labels")))
    return read_modelnet(Path(data.path), data.points.num_points,
                         Path(data.points.cache_dir).expanduser())


def point_classes(data: DataConfig) -> int:
    """The number of classes of point-cloud data, without reading the clouds."""
    if data.dataset == "shapes3d":
        return len(SHAPES3D_CLASSES)
    return len(modelnet_classes(Path(data.path).expanduser()))


def _point_datasets(data: DataConfig) -> tuple[Dataset, Dataset, int]:
    """The clouds were checked where they were read or made (points/modelnet.py,
    points/shapes3d.py)."""
    splits = point_splits(data)
    for split, points in splits.points.items():
        if len(points) == 0:
            raise DataError(f"data.path: {data.path} has no clouds in its {split} split")
    make = lambda split: PointClouds(splits.points[split], splits.labels[split],
                                     data.points.num_points)
    return make("train"), make("val"), len(splits.classes)


def up_axis(data: DataConfig) -> int:
    """The index of the axis that point clouds turn about: ModelNet's HDF5 files (PointNet's
    convention) have y up, the meshes and shapes3d z."""
    axis = data.points.up_axis
    if axis == "auto":
        hdf5 = data.dataset == "modelnet" and modelnet_layout(Path(data.path).expanduser()) \
            == "hdf5"
        axis = "y" if hdf5 else "z"
    return "xyz".index(axis)


def _check_classes(data: DataConfig, train: Dataset, val: Dataset, num_classes: int):
    if data.num_classes is not None and data.num_classes != num_classes:
        raise DataError(f"data.num_classes={data.num_classes}, but the {data.dataset} data "
                        f"{data.path or ''} has {num_classes} classes: fix the recipe, or "
                        "point data.path at the dataset it was written for")
    return train, val, num_classes


def collate_for(data: DataConfig):
    """The batch collation these settings need: bytes and views under data.decode=gpu, else
    the default stacking."""
    return collate_encoded if data.decode == "gpu" else None


def build_data(data: DataConfig, batch_size: int, seed: int, device: torch.device,
               rank: int = 0, world_size: int = 1, processes_per_node: int = 1,
               stop_signals: tuple[str, ...] = ("SIGUSR1",)) -> DataBundle:
    """Loaders for this rank's share of the data (see `EpochSampler`); their workers leave
    SIGTERM and `stop_signals` to the training process (worker_signals.py)."""
    if data.decode == "gpu" and device.type != "cuda":
        raise DeviceError(f"data.decode=gpu decodes with nvJPEG on a CUDA device, but this "
                          f"run is on {device}: set data.decode=cpu")
    workers = resolve_num_workers(data.num_workers, processes_per_node)
    pin = device.type == "cuda" if data.pin_memory == "auto" else data.pin_memory
    # the loaders' own generator: making an iterator draws a seed for its workers, which from
    # torch's global generator would shift the draws of dropout and device augmentation when a
    # resumed run makes its iterator at another moment than the uninterrupted one did
    common = dict(num_workers=workers, pin_memory=pin, stop_signals=stop_signals,
                  generator=torch.Generator().manual_seed(seed))
    if workers > 0:
        common.update(persistent_workers=data.persistent_workers,
                      prefetch_factor=data.prefetch_factor)
        if data.worker_start != "auto":
            common["multiprocessing_context"] = data.worker_start
    if data.kind == "tokens" and not data.from_user_code:
        return _token_data(data, batch_size, seed, rank, world_size, common)
    train_set, val_set, num_classes = build_datasets(data, seed, rank)
    # your own token data: blocks of ids, stacked; the third figure is the vocabulary
    num_classes, vocab_size = (None, num_classes) if data.kind == "tokens" else \
        (num_classes, None)
    common["collate_fn"] = collate_for(data)
    shard = dict(rank=rank, world_size=world_size)
    val_size = data.val_image_size or data.image_size
    val_sampler = EpochSampler(len(val_set), val_size, shuffle=False, pad=True, **shard)
    val_loader = _sample_loader(data, val_set, val_sampler, batch_size * 2, False, val_size,
                                common, between_passes=False)
    if isinstance(train_set, IterableDataset):  # your own stream (streams.py)
        stream = Stream(train_set, data.dataset, rank, world_size, batch_size, seed)
        # fresh workers each epoch: they take the stream's epoch and skip with them
        train_loader = SignalSafeLoader(stream, batch_size=batch_size, drop_last=True,
                                        **{**common, "persistent_workers": False})
        return DataBundle(train_loader, stream, val_loader, val_sampler, num_classes, workers,
                          vocab_size)
    if len(train_set) < batch_size * world_size:
        raise DataError(f"the training set has {len(train_set)} samples, fewer than one batch "
                        f"(train.batch_size={batch_size} x {world_size} processes); lower the "
                        "batch size")
    train_sampler = EpochSampler(len(train_set), data.image_size, shuffle=True, seed=seed,
                                 **shard)
    largest = max(image_sizes(data), default=data.image_size)  # points, tokens: none
    train_loader = _sample_loader(data, train_set, train_sampler, batch_size, True, largest,
                                  common, between_passes=True)
    return DataBundle(train_loader, train_sampler, val_loader, val_sampler, num_classes, workers,
                      vocab_size)


def uses_buffers(data: DataConfig, dataset: Dataset) -> bool:
    """Whether data.loader means batch buffers for this dataset; a ConfigError for
    data.loader=buffers where the dataset cannot render into them."""
    renders = hasattr(dataset, "render_rows") and data.decode == "cpu"
    if data.loader == "buffers" and not renders:
        raise ConfigError(f"data.loader=buffers: data.dataset={data.dataset} with "
                          f"data.decode={data.decode} does not render into batch buffers (packs "
                          "and image folders decoded on the CPU and the blocks of a token pack "
                          "do); use data.loader=auto")
    return renders and data.loader != "torch"


def _sample_loader(data: DataConfig, dataset: Dataset, sampler: EpochSampler, batch_size: int,
                   drop_last: bool, largest: int, common: dict, between_passes: bool):
    """Batch buffers (batch_buffers.py) where the dataset renders into them, else torch's
    DataLoader; `largest`: the largest sample size the sampler will ask for. Batch buffers
    are kept `between_passes` only for training (with data.persistent_workers): the
    validation loader's, twice as large, are freed after each evaluation."""
    if not uses_buffers(data, dataset):
        return SignalSafeLoader(dataset, batch_size=batch_size, sampler=sampler,
                                drop_last=drop_last, **common)
    return BufferedLoader(dataset, sampler, batch_size, drop_last, common["num_workers"],
                          largest, prefetch_factor=common.get("prefetch_factor", 1),
                          persistent_workers=between_passes and common.get(
                              "persistent_workers", True),
                          stop_signals=common["stop_signals"],
                          context=common.get("multiprocessing_context"),
                          pin=common["pin_memory"])


def token_pack_of(data: DataConfig) -> TokenPack:
    """The token pack the recipe reads: data.path, or the built-in corpus (made on first use)."""
    if data.dataset == "arithmetic":
        a = data.arithmetic
        return TokenPack(ensure_arithmetic(Path(a.cache_dir).expanduser(), a.seed, a.num_train,
                                           a.num_val, a.max_operand, a.operations))
    return TokenPack(data.path)


def token_datasets(data: DataConfig) -> tuple[Dataset, Dataset, TokenPack]:
    pack = token_pack_of(data)
    seq_len = data.tokens.seq_len
    if data.tokens.batching == "blocks":
        return (TokenBlocks(pack.split("train"), seq_len), TokenBlocks(pack.split("val"),
                                                                       seq_len), pack)
    return (TokenDocuments(pack.split("train"), seq_len, pack.eos_id),
            TokenDocuments(pack.split("val"), seq_len, pack.eos_id), pack)


def _token_data(data: DataConfig, batch_size: int, seed: int, rank: int, world_size: int,
                common: dict) -> DataBundle:
    """Blocks of a token stream (sampled like images), or documents batched by length."""
    train_set, val_set, pack = token_datasets(data)
    shard = dict(rank=rank, world_size=world_size)
    documents = data.tokens.batching == "documents"
    collate = pad_documents if documents else None
    if documents:
        train_sampler = LengthBucketSampler(train_set.lengths, batch_size,
                                            data.tokens.bucket_pool_batches, seed=seed, **shard)
        train_loader = SignalSafeLoader(train_set, batch_sampler=train_sampler,
                                        collate_fn=collate, **common)
    else:
        train_sampler = EpochSampler(len(train_set), 0, shuffle=True, seed=seed, **shard)
        train_loader = _sample_loader(data, train_set, train_sampler, batch_size, True, 0,
                                      common, between_passes=True)
    if len(train_loader) == 0:
        raise DataError(f"the training split of {pack.root} makes {len(train_set)} samples of "
                        f"data.tokens.seq_len={data.tokens.seq_len}, fewer than one batch "
                        f"(train.batch_size={batch_size} x {world_size} processes); lower the "
                        "batch size or the sequence length")
    val_sampler = EpochSampler(len(val_set), 0, shuffle=False, pad=True, **shard)
    val_loader = _sample_loader(data, val_set, val_sampler, batch_size * 2, False, 0,
                                {**common, "collate_fn": collate}, between_passes=False)
    answer = None
    if data.dataset == "arithmetic":
        answer = (ord(ANSWER_START), pack.eos_id)
    return DataBundle(train_loader, train_sampler, val_loader, val_sampler, None,
                      common["num_workers"], pack.vocab_size, answer)


class DeviceBatcher:
    """Move a uint8 batch to the device (non-blocking from pinned memory), then convert,
    normalise and lay it out (channels_last) there, as batched tensor operations."""

    def __init__(self, device: torch.device, mean, std, channels_last: bool):
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.scale = (1.0 / (255.0 * torch.tensor(std))).view(1, 3, 1, 1).to(device)
        self.shift = (torch.tensor(mean) / torch.tensor(std)).view(1, 3, 1, 1).to(device)

    def __call__(self, images: torch.Tensor | EncodedBatch, labels: torch.Tensor):
        """NHWC uint8 (or an EncodedBatch, decoded here) in; NCHW float out (NHWC in memory,
        which is channels_last). Float NCHW images (your own dataset's, already normalised)
        are only moved and laid out."""
        if isinstance(images, EncodedBatch):
            images = decode_batch(images, self.device)
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = images.permute(0, 3, 1, 2).float().mul_(self.scale).sub_(self.shift)
        return images.contiguous(memory_format=self.memory_format), labels
