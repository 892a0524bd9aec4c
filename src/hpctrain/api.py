"""hpctrain from Python: `hpctrain.fit(model, train_data, val_data)` in a script or a notebook.

fit trains on the same engine as `hpctrain run` and writes the same run directory; the model
and the datasets (or DataLoaders, or a LightningDataModule) you hand it take the place of
`model.name` and `data.dataset` (the run's config.yaml records them as `given:ClassName`).
The script is the entry point under torchrun and a scheduler's launcher: every process runs
it, builds its own model and data, and fit finds its rank from the launcher (DDP/FSDP as
configured). A preemption signal or the time limit saves a checkpoint and ends the process
with exit status 75, as `hpctrain run` does; the same command with `resume=auto` continues
the run.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from hpctrain import config as configuration
from hpctrain import hf_trainer, user_code
from hpctrain.config import Config
from hpctrain.data.given_loaders import is_loader, is_plain, like, own_collate
from hpctrain.tasks import lightning, lightning_task
from hpctrain.errors import ConfigError, Preempted
from hpctrain import process_clock


def load_config(recipe: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                **settings) -> Config:
    """The typed configuration: a recipe (a shipped name or a .yaml path; none: hpctrain's
    defaults, the fields' own, named after the running script), then `settings` as keyword
    arguments (sections as dicts, `train={"epochs": 3}`, or dotted keys,
    `**{"train.epochs": 3}`), then `overrides`, `key=value` strings as on the command line
    (`sys.argv[1:]`), which win."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides: give a list of key=value strings, not the string "
                          f"{overrides!r}")
    if recipe is not None:
        return configuration.load_config(recipe, list(overrides), settings)
    return configuration.from_defaults(list(overrides), {"name": _script_name(), **settings})


def _script_name() -> str:
    """The running script's name (`train_cifar` for train_cifar.py): a run made by fit is
    continued by resume=auto from the same script, not from another one; `fit` in a notebook."""
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(script).stem).strip(".-") if script else ""
    return stem or "fit"


def fit(model: nn.Module, train_data: Dataset | DataLoader | None = None,
        val_data: Dataset | DataLoader | None = None,
        config: Config | str | Path | None = None, collate_fn: Callable | None = None,
        callbacks: list | None = None, *, args=None, train_dataset: Dataset | None = None,
        eval_dataset: Dataset | None = None, data_collator: Callable | None = None,
        processing_class=None, compute_metrics: Callable | None = None,
        **overrides) -> dict | None:
    """Train `model` on `train_data`, evaluating on `val_data`; the run's summary (as in
    summary.json) on rank 0, None on the other ranks.

    `config`: a Config (`hpctrain.load_config`), a recipe name or path, or None for
    hpctrain's defaults (not the shapes recipe `hpctrain run` trains); `overrides` as keyword
    arguments, as for load_config (`fit(model, data, precision="bf16", train={"epochs": 3})`).
    The data are Datasets as a recipe's `data.dataset` factory returns them
    (data/user_datasets.py), DataLoaders (their batch size, collate, order, drop_last and
    workers kept: data/given_loaders.py), or a LightningDataModule in `train_data`; with none,
    a LightningModule's own train_dataloader and val_dataloader, as Lightning's Trainer.fit.
    Samples of images, point clouds, token blocks or tensors of any shape, and the training
    set may be a stream (data/streams.py). With `task: auto`, a LightningModule trains on its
    own steps (tasks/lightning.py), any other model on the task the first training sample
    picks (an image or other inputs with an integer label, or a float target: regression),
    and the run says which. Without `val_data`, data.val_fraction (0.1 when unset) of
    `train_data` is held out for validation, the same samples on every rank and every
    restart. `collate_fn`: your function making a batch of a list of samples (padding them,
    with lengths or masks), as a recipe's data.collate (data/batching.py). `callbacks`: a
    LightningModule's Lightning callbacks, as Lightning's Trainer takes them, after the
    recipe's lightning.callbacks (tasks/lightning_callbacks.py says what each becomes).

    What Hugging Face's Trainer is given, by its names (hf_trainer.py): `args`
    (TrainingArguments), `train_dataset`, `eval_dataset`, `data_collator`, `processing_class`,
    `compute_metrics` (on the whole validation set: task.compute_metrics).

    Raises a UserError (ConfigError, DataError, ...; `.exit_code` as the command line's) for
    bad input, and SystemExit(75) when a stop signal or the time limit saved the run early.
    """
    started = _job_start()
    if not isinstance(model, nn.Module):
        raise ConfigError(f"fit(model=...): a torch.nn.Module, not a {type(model).__name__}")
    train_data, val_data, collate_fn, overrides = hf_trainer.from_trainer(
        model, args, {"train_data": train_data, "train_dataset": train_dataset,
                      "val_data": val_data, "eval_dataset": eval_dataset,
                      "collate_fn": collate_fn, "data_collator": data_collator,
                      "processing_class": processing_class}, overrides)
    brings_val = _check_data(model, train_data, val_data)
    references = {"model.name": user_code.given(type(model).__name__),
                  "data.dataset": user_code.given(_data_name(model, train_data)),
                  "model.kwargs": {}, "data.kwargs": {},  # nothing to pass them to
                  **_given_functions({"collate_fn": collate_fn,
                                      "compute_metrics": compute_metrics})}
    config = _configured(config, {**overrides, **references}, model, train_data, collate_fn,
                         own_defaults=config is None and args is None)
    if callbacks:
        config = _with_callbacks(config, callbacks)
    if val_data is None and not brings_val:
        train_data, val_data = _held_out(train_data, config) if _evaluates(model) else \
            (train_data, _dataset_of(train_data))  # never read: nothing is held out
    _hand_over(model, train_data, val_data, references)
    return _train(config, started)


def _hand_over(model: nn.Module, train_data, val_data, references: dict) -> None:
    """The model and the data, given to user_code under the names the settings give them."""
    from hpctrain.cluster.environment import detect

    user_code.give(references["model.name"], lambda: model)
    leader = detect().local_rank == 0  # a LightningModule's prepare_data: once a node
    user_code.give(references["data.dataset"], lambda: lightning.own_loaders(model, leader)
                   if train_data is None else train_data if val_data is None else
                   (train_data, val_data))


# fit's function arguments -> the setting naming each, and what it is a function of
FUNCTIONS = {"collate_fn": ("data.collate", "a list of samples"),
             "compute_metrics": ("task.compute_metrics", "the predictions and labels")}


def _given_functions(functions: dict) -> dict:
    """The settings naming the functions given to fit (FUNCTIONS), each handed to user_code
    under its name; a ConfigError for what is no function."""
    references = {}
    for argument, function in functions.items():
        key, of = FUNCTIONS[argument]
        if function is None:
            continue
        if not callable(function):
            raise ConfigError(f"fit({argument}=...): a function of {of}, not a "
                              f"{type(function).__name__}")
        references[key] = user_code.given(_name_of(function))
        user_code.give(references[key], function)
    return references


def _with_callbacks(config: Config, callbacks) -> Config:
    """The recipe's lightning.callbacks, then fit's (handed over as they are)."""
    if not isinstance(callbacks, (list, tuple)):
        raise ConfigError(f"fit(callbacks=...): a list of Lightning callbacks, not a "
                          f"{type(callbacks).__name__}")
    given = []
    for index, callback in enumerate(callbacks):
        reference = user_code.given(f"callbacks[{index}].{type(callback).__name__}")
        user_code.give(reference, lambda callback=callback: callback)
        given.append({"name": reference, "kwargs": {}})
    recipe = [spec.model_dump(mode="json") for spec in config.lightning.callbacks]
    return configuration.with_settings(config, {"lightning.callbacks": recipe + given})


def _check_data(model: nn.Module, train_data, val_data) -> bool:
    """Whether the data given bring their own validation set (a LightningDataModule, or no
    data: a LightningModule's own loaders); a ConfigError for what fit does not take."""
    if train_data is None:
        if not lightning.is_lightning_module(model) or val_data is not None:
            raise ConfigError("fit(): give train_data: a Dataset, a DataLoader or a "
                              "LightningDataModule (a LightningModule may bring its own "
                              "train_dataloader and val_dataloader instead)")
        return True
    if lightning.is_data_module(train_data):
        if val_data is not None:
            raise ConfigError("fit(): a LightningDataModule brings its own validation set: "
                              "give no val_data beside it")
        return True
    for what, data in (("train_data", train_data), ("val_data", val_data)):
        if data is not None and not (hasattr(data, "__getitem__") or is_loader(data)):
            raise ConfigError(f"fit({what}=...): a torch.utils.data.Dataset or DataLoader, "
                              f"not a {type(data).__name__}")
    return False


def _data_name(model: nn.Module, train_data) -> str:
    """What config.yaml records as data.dataset: the dataset's class (a DataLoader's), the
    DataModule's, or the LightningModule's own loaders."""
    if train_data is None:
        return f"{type(model).__name__}.train_dataloader"
    return type(train_data.dataset if is_loader(train_data) else train_data).__name__


def _name_of(function) -> str:
    return getattr(function, "__name__", type(function).__name__)


def _task_from_samples(config: Config, train_data: Dataset, model: nn.Module,
                       collate_fn: Callable | None) -> Config:
    """With `task: auto`, the task a LightningModule is, else the task the first training
    sample calls for (as your collate_fn batches it; a stream's samples are not read
    ahead), said once."""
    from hpctrain.cluster.environment import detect
    from hpctrain.data.user_datasets import task_of_sample
    from hpctrain.tasks.tensors import row, split

    if config.task.name == "auto" and lightning.is_lightning_module(model):
        return configuration.with_settings(config, {"task.name": lightning_task.SPEC.name})
    if is_loader(train_data):  # its dataset, batched by its collate
        collate_fn = collate_fn or own_collate(train_data)
        train_data = train_data.dataset
    if config.task.name != "auto" or not hasattr(train_data, "__getitem__") or \
            isinstance(train_data, IterableDataset):  # a stream, a LightningDataModule
        return config
    try:
        sample = train_data[0]
        if collate_fn is not None:  # the first row of its batch of one
            sample = row(*split(collate_fn([sample])), 0)
        picked = task_of_sample(sample)
    except Exception:  # the user's __getitem__: the sample checks name what is wrong
        return config
    if picked is None or picked[0] == config.task_spec.name:
        return config
    if detect().rank == 0:
        print(f"hpctrain: task {picked[0]}: the first training sample has {picked[1]} (set "
              "task=... to choose another)", flush=True)
    return configuration.with_settings(config, {"task.name": picked[0]})


def _configured(config: Config | str | Path | None, settings: dict, model: nn.Module,
                train_data, collate_fn: Callable | None, own_defaults: bool) -> Config:
    """The run's Config: `config` (a Config, a recipe, or hpctrain's defaults) with fit's
    `settings`, its task picked from the samples, and where neither a recipe nor
    TrainingArguments said them (`own_defaults`), the task's fit defaults."""
    config = configuration.with_settings(config, settings) if isinstance(config, Config) \
        else load_config(config, **settings)
    config = _task_from_samples(config, train_data, model, collate_fn)
    return _with_fit_defaults(config, model, is_loader(train_data)) if own_defaults else config


def _with_fit_defaults(config: Config, model: nn.Module, loader: bool = False) -> Config:
    """`config` with the task's fit defaults (a Hugging Face model: the Trainer's) where you
    did not set them, said once; hpctrain's own defaults are the images'. Your DataLoader's
    batch size (`loader`) stays yours."""
    from hpctrain.cluster.environment import detect

    hf = hf_trainer.is_hf_model(model)
    defaults = hf_trainer.TRAINER_DEFAULTS if hf else config.task_spec.fit_defaults
    chosen = {key: value for key, value in defaults.items() if not config.told(key)
              and not (loader and key == "train.batch_size")}
    if not chosen:
        return config
    if detect().rank == 0:
        whose = "a Hugging Face model (the Trainer's)" if hf else \
            f"task {config.task_spec.name}'s"
        print(f"hpctrain: fit's defaults for {whose}: "
              + " ".join(f"{key}={value}" for key, value in chosen.items())
              + " (set any to choose)", flush=True)
    return configuration.with_settings(config, chosen)


class _Part(Dataset):
    """Some samples of a dataset, keeping what says its number of classes or vocabulary."""

    def __init__(self, dataset: Dataset, indices: list[int]):
        self.dataset, self.indices = dataset, indices
        for attribute in ("classes", "num_classes", "vocab_size"):
            if hasattr(dataset, attribute):
                setattr(self, attribute, getattr(dataset, attribute))

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]


def _evaluates(model: nn.Module) -> bool:
    """Whether the run evaluates: not a LightningModule without validation_step, which
    Lightning trains on all its data, holding none out."""
    return not lightning.is_lightning_module(model) or \
        lightning.overrides(type(model), "validation_step")


def _dataset_of(data: Dataset | DataLoader) -> Dataset:
    return data.dataset if is_loader(data) else data


def _held_out(train_data: Dataset | DataLoader, config: Config) -> tuple:
    """(train, val): data.val_fraction of the training set held out; of a DataLoader's
    dataset, both parts in DataLoaders set as it was (its collate batching the validation
    part too, in order)."""
    from hpctrain.data.splits import hold_out

    if is_loader(train_data):
        if not is_plain(train_data):
            raise ConfigError(f"fit(): train_data is a DataLoader with its own "
                              f"{type(train_data.sampler).__name__}, which draws from the "
                              "whole dataset: give val_data, as hpctrain would hold some of "
                              "it out")
        train, val = _held_out(train_data.dataset, config)
        return like(train_data, train), like(train_data, val, validation=True)
    if isinstance(train_data, IterableDataset):
        raise ConfigError("fit(): train_data is a stream (an IterableDataset), which has no "
                          "samples to hold out: give val_data, a map-style Dataset")

    fraction = config.data.val_fraction or 0.1
    train, val = hold_out(list(range(len(train_data))), fraction, config.seed)
    return _Part(train_data, train), _Part(train_data, val)


_fitted = False  # a run of this process came before: the next counts from its own call


RUNNERS = ("pytest", "py.test", "ipykernel", "ipython")  # main modules that are no script


def _job_start() -> float:
    """When this run's job began (perf_counter): the script's start for its first fit(), as
    the OS records it (its imports are the run's start-up); the call, for a later one, in
    an interactive session (a notebook's kernel may have started hours before) or under a
    test runner."""
    global _fitted
    script = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    first, _fitted = not _fitted, True
    if first and script and not any(runner in Path(script).name.lower() or
                                     f"/{runner}/" in script for runner in RUNNERS):
        return process_clock.started_at()
    return time.perf_counter()


def _train(config: Config, started: float) -> dict | None:
    from hpctrain.train.loop import train
    from hpctrain.train.preemption import catch_early, release_early
    from hpctrain.train.telemetry import print_summary

    listening = threading.current_thread() is threading.main_thread()  # signals: main only
    if listening:
        catch_early()
    try:
        summary = train(config, started=started)
    except Preempted as stop:
        stop.tell()
        raise SystemExit(stop.exit_code) from None
    finally:
        if listening:
            release_early()
    if summary is not None:
        print_summary(summary, summary["run_dir"])
    return summary
