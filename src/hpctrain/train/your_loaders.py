"""What your DataLoaders set (data/given_loaders.py) becomes the run's settings, where you
did not tell hpctrain otherwise: their batch sizes and workers. The run's config.yaml, its
banner, `memory` and `bench data` then speak of the batch your loader makes; a setting you
gave (`train.batch_size=64` in the recipe, on the command line or to `hpctrain.fit`) wins, and
the banner says what it replaced."""

from __future__ import annotations

from hpctrain.config import Config, with_settings
from hpctrain.data.user_datasets import loader_settings


def with_your_loaders(config: Config, leader: bool = True) -> Config:
    """`config` with your training DataLoader's batch size (train.batch_size) and workers
    (data.num_workers) and your validation DataLoader's batch size (data.val_batch_size),
    each unless told (Config.told). Makes your data (its factory, a DataModule's
    prepare_data on the node's first process, `leader`, and setup) once in this process, as
    training will use it."""
    if not config.data.from_user_code:
        return config
    train, val = loader_settings(config.data, config.seed, leader)
    settings = {}
    if train is not None:
        if not (config.told("train.batch_size") or config.told("train.global_batch_size")):
            settings["train.batch_size"] = train.batch_size
        if not config.told("data.num_workers"):
            settings["data.num_workers"] = train.num_workers
    if val is not None and not config.told("data.val_batch_size"):
        settings["data.val_batch_size"] = val.batch_size
    return with_settings(config, settings) if settings else config
