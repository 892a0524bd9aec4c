"""hpctrain: train deep-learning models on GPU supercomputers, fast and explained.

From Python: `hpctrain.fit(model, train_data, val_data)` and `hpctrain.load_config(...)`
(api.py), `hpctrain.shard(items)` for a stream of your own (data/streams.py); they are
imported on first use, so that the command line starts without torch.
"""

from hpctrain.version import __version__

__all__ = ["fit", "load_config", "shard"]


def __getattr__(name: str):
    if name == "shard":
        from hpctrain.data.streams import shard

        return shard
    if name in __all__:
        from hpctrain import api

        return getattr(api, name)
    raise AttributeError(f"module 'hpctrain' has no attribute {name!r}")
