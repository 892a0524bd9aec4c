"""A run's final training state, read from its last checkpoint, and two of them compared
exactly (model, EMA, optimiser buffers, schedule)."""

import torch

from hpctrain.runs.directory import list_checkpoints
from hpctrain.train.checkpoints.checkpoint import read_checkpoint


def final_state(run_dir):
    return read_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])


def assert_same_training_state(a, b):
    assert a["meta"]["step"] == b["meta"]["step"]
    for part in ("model", "ema"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), f"{part}.{key} differs"
    # the optimiser's state keyed by parameter name: "state.<parameter>.momentum_buffer"
    buffers = [key for key in a["optim"] if key.endswith(".momentum_buffer")]
    assert buffers and a["optim"].keys() == b["optim"].keys()
    for key in buffers:
        assert torch.equal(a["optim"][key], b["optim"][key]), f"optim.{key} differs"
    assert a["meta"]["scheduler"]["last_epoch"] == b["meta"]["scheduler"]["last_epoch"]
