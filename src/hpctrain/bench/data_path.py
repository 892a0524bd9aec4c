"""`hpctrain bench data RECIPE`: can this input pipeline keep the model fed, and how to make it.

It measures the recipe's training loader alone (no model) over a grid of DataLoader workers and
prefetch depths, and the rate at which one core of this machine does nothing but decode the
stored images: that rate times the cores the workers use is the practical ceiling, and the
ratio reached says how much goes to everything else (file opens, resizing, transport). With
`--model` it also runs the recipe's training step on synthetic data of the same shape (the
real `hpctrain run` machinery: precision, channels_last, compile) and compares the two rates.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from torch.utils.data import DataLoader, IterableDataset

from hpctrain.cluster.environment import node_local_scratch
from hpctrain.config import Config, load_config
from hpctrain.bench import python_profile
from hpctrain.data.batch_buffers import BufferedLoader
from hpctrain.data.images.image_folders import ImageFolderDataset
from hpctrain.data import batching
from hpctrain.data.loader import build_datasets, usable_cpus, uses_buffers
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.images.image_pack_dataset import ShardDataset, jpeg_decoder
from hpctrain.data.streams import Stream
from hpctrain.data.user_datasets import loader_settings
from hpctrain.errors import DataError
from hpctrain.parallel.processes import per_device_batch
from hpctrain.train.your_loaders import with_your_loaders

GOOD_ENOUGH = 0.95  # the smallest setting within 5 % of the best is the one to use
HEADROOM = 1.2  # a loader less than 20 % faster than the model stalls it on a slow batch


@dataclass
class Setting:
    num_workers: int
    prefetch_factor: int
    samples_per_second: float


@dataclass
class DataBench:
    recipe: str
    dataset: str
    unit: str  # what a sample is: image | block | document | cloud
    batch_size: int
    image_size: int
    cores: int
    processes_per_node: int
    decoder: str | None
    decode_one_core: float | None  # images/s, full-size decoding only, one core
    settings: list[Setting] = field(default_factory=list)
    best: Setting | None = None
    recommended: Setting | None = None
    ceiling: float | None = None  # decode_one_core x the cores the best setting uses
    ratio: float | None = None  # best / ceiling
    model_samples_per_second: float | None = None  # the training step alone
    starved_fraction: float | None = None  # share of the step time the device would wait
    advice: list[str] = field(default_factory=list)
    python: python_profile.InputProfile | None = None  # --python, at the recommended setting

    def to_json(self) -> dict:
        return asdict(self)


def worker_grid(cores: int) -> list[int]:
    """1, 2, 4, ... up to the cores, and the core count itself."""
    grid = [2 ** i for i in range(int(math.log2(max(1, cores))) + 1)]
    return sorted(set(grid + [max(1, cores)]))


def loader_rate(dataset, batch_size: int, image_size: int, workers: int, prefetch: int,
                seconds: float, seed: int = 0, collate_fn=None, buffers: bool = False) -> float:
    """Images per second of a training loader (batch buffers where `buffers`, else torch's
    DataLoader), timed from its first batch (worker start-up excluded) for `seconds`, over
    as many shuffled epochs (or passes over a stream) as that takes."""
    options = dict(batch_size=batch_size, num_workers=workers, drop_last=True,
                   prefetch_factor=prefetch if workers else None, collate_fn=collate_fn)
    if isinstance(dataset, IterableDataset):  # your own stream: read pass after pass
        loader = DataLoader(Stream(dataset, "the stream", 0, 1, batch_size), **options)
        return _rate(iter(loader), batch_size, seconds)
    if len(dataset) < batch_size:  # no whole batch: the epochs below would never end
        raise DataError(f"the training set has {len(dataset)} samples, fewer than one batch "
                        f"of train.batch_size={batch_size}; lower the batch size")
    sampler = EpochSampler(len(dataset), image_size, shuffle=True, seed=seed)
    if buffers:
        loader = BufferedLoader(dataset, sampler, batch_size, True, workers, image_size,
                                prefetch_factor=prefetch)
    else:
        loader = DataLoader(dataset, sampler=sampler, persistent_workers=workers > 0,
                            **options)

    def epochs():
        for epoch in itertools.count():
            sampler.set_epoch(epoch, image_size)
            yield from loader

    return _rate(epochs(), batch_size, seconds)


def _rate(batches, batch_size: int, seconds: float) -> float:
    """Samples per second of `batches` (endless), from the first one on."""
    next(batches)
    started, samples = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - started) < seconds:
        next(batches)
        samples += batch_size  # drop_last: every batch is whole
    return samples / elapsed


def decode_rate(dataset, seconds: float) -> float | None:
    """Images per second of this process (one core) decoding stored images at full size, no
    crop, resize or batching; None for data that is not decoded (synthetic)."""
    decode = getattr(dataset, "decode_full", None)
    if decode is None:
        return None
    decode(0)  # imports, first mapping
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        decode(count * 7919 % len(dataset))  # spread over the dataset, reproducibly
        count += 1
    return count / (time.perf_counter() - started)


def model_rate(config: Config, num_classes: int | None, steps: int) -> float:
    """Steady samples/s of the recipe's training step, with the loader's waiting taken out:
    on synthetic images of the same shape, or on the recipe's own tokens or clouds (reading
    them costs next to nothing)."""
    from hpctrain.train.loop import train

    batch = config.train.global_batch_size or (config.train.batch_size
                                               * config.train.grad_accum_steps)
    data = config.data.kind_spec.stand_in(config.data, batch, steps + 1, num_classes) \
        or config.data
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-") as out:
        trial = config.model_copy(update=dict(
            data=data, output_dir=out, run_name="bench-model", resume=None,
            tracking=config.tracking.model_copy(update=dict(sinks=[])), report=False,
            train=config.train.model_copy(update=dict(
                max_steps=steps, epochs=1, log_every=max(1, steps // 5),
                eval_every_epochs=1e6))))
        with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the report
            summary = train(trial)
    return summary["samples_per_second"] / max(1e-9, 1 - summary["data_wait_fraction"])


def bench_data(recipe: str | None, overrides: list[str], workers: list[int] | None = None,
               prefetch: list[int] = (2, 4), seconds: float = 5.0, with_model: bool = False,
               model_steps: int = 30, processes_per_node: int = 1,
               python: bool = False) -> DataBench:
    config = with_your_loaders(load_config(recipe, overrides))  # your DataLoader's batch
    kind = config.data.kind_spec
    train_set, _, num_classes = build_datasets(config.data, config.seed,
                                               scratch=node_local_scratch())
    num_classes = None if kind.vocabulary else num_classes
    unit = kind.unit(config.data)
    cores = max(1, usable_cpus() // processes_per_node)
    batch = per_device_batch(config, 1)[0]  # one process's micro-batch (global_batch_size)
    report = DataBench(
        recipe=config.name, dataset=config.data.dataset,
        unit=unit, batch_size=batch,
        image_size=config.data.images.image_size, cores=cores,
        processes_per_node=processes_per_node,
        decoder=(jpeg_decoder() if isinstance(train_set, ShardDataset) else
                 "pil" if isinstance(train_set, ImageFolderDataset) else None),
        decode_one_core=decode_rate(train_set, min(seconds, 3.0)))
    given = loader_settings(config.data, config.seed)[0] if config.data.from_user_code \
        else None  # your DataLoader's collate
    collate = batching.collate_for(config.data, given)
    buffers = uses_buffers(config.data, train_set)
    for count in workers or worker_grid(cores):
        for depth in prefetch:
            rate = loader_rate(train_set, batch, config.data.images.image_size, count, depth,
                               seconds, config.seed, collate, buffers)
            report.settings.append(Setting(count, depth, rate))
    report.best = max(report.settings, key=lambda s: s.samples_per_second)
    report.recommended = min(
        (s for s in report.settings
         if s.samples_per_second >= GOOD_ENOUGH * report.best.samples_per_second),
        key=lambda s: (s.num_workers, s.prefetch_factor))
    if report.decode_one_core:
        report.ceiling = report.decode_one_core * min(max(1, report.best.num_workers), cores)
        report.ratio = report.best.samples_per_second / report.ceiling
    if python:
        chosen = report.recommended

        def run(seconds: float, workers: int = chosen.num_workers) -> None:
            loader_rate(train_set, batch, config.data.images.image_size, workers,
                        chosen.prefetch_factor, seconds, config.seed, collate, buffers)

        report.python = python_profile.sample(run, seconds, lambda s: run(s, 0))
    if with_model:
        report.model_samples_per_second = model_rate(config, num_classes, model_steps)
        report.starved_fraction = max(
            0.0, 1 - report.best.samples_per_second / report.model_samples_per_second)
    report.advice = advise(report, config)
    return report


def advise(report: DataBench, config: Config) -> list[str]:
    """What to change, most useful first."""
    advice = [f"use data.num_workers={report.recommended.num_workers} "
              f"data.prefetch_factor={report.recommended.prefetch_factor} (the smallest "
              f"setting within {1 - GOOD_ENOUGH:.0%} of the best)"]
    loader, model = report.best.samples_per_second, report.model_samples_per_second
    rate = "img/s" if report.unit == "image" else f"{report.unit}s/s"
    if model is not None:
        if loader < model:
            advice.append(f"the loader would starve the model: {loader:,.0f} {rate} against "
                          f"{model:,.0f} {rate} the step could take; the device would wait "
                          f"{report.starved_fraction:.0%} of the time")
        elif loader < HEADROOM * model:
            advice.append(f"the loader keeps up with little margin ({loader / model:.2f}x the "
                          "model's rate): a slow batch or a shared node will stall the device")
        else:
            advice.append(f"the loader keeps up: {loader / model:.1f}x the model's "
                          f"{model:,.0f} {rate}")
    short = model is not None and loader < HEADROOM * model
    if config.data.dataset == "imagefolder" and (short or model is None):
        advice.append(f"pack the images into shards (hpctrain pack {config.data.path} DST, "
                      "then data.dataset=shards data.path=DST): no file opens, cheaper decoding")
    if config.data.images.decode == "gpu":
        advice.append("data.images.decode=gpu: the workers only read bytes, the JPEGs are "
                      "decoded on the device, so the rates above leave the decoding out")
    elif report.decoder == "pil" and config.data.dataset == "shards":
        advice.append('install simplejpeg (pip install "hpctrain[jpeg]"): 25 % faster JPEG '
                      "decoding")
    if report.ratio is not None and report.ratio < 0.5:
        advice.append(f"the loader reaches {report.ratio:.0%} of what its cores decode: the "
                      "rest goes to file access, resizing and batching. A pack removes the "
                      "file opens; for images this small, raw pixels remove the decoding "
                      "(hpctrain pack --store auto)" if report.image_size <= 64 else
                      f"the loader reaches {report.ratio:.0%} of what its cores decode: the "
                      "rest goes to file access, resizing and batching; a pack removes the "
                      "file opens (hpctrain pack)")
    if short and config.data.dataset == "shards":
        advice.append("more CPU per device (--cpus-per-gpu), a pack with raw pixels "
                      "(hpctrain pack --store auto --raw-fraction 0.5) or pre-resized images "
                      "(--max-side) make each sample cheaper")
    return advice
