"""hpctrain.fit and hpctrain.load_config: the tests that start several processes or a server
(torchrun, Slurm, PostgreSQL, the browser, the model hub) (the others are
tests/unit/test_api.py, tests/runs/test_api.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launching import one_thread_env



RANK_SEEDED = '''
import os, sys
import torch
from torch import nn
import hpctrain
from levels import Levels

out = sys.argv[1]
torch.manual_seed(int(os.environ["RANK"]))  # a different initialisation in each process
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(8, 3))
torch.save(model.state_dict(), f"{out}/init-{os.environ['RANK']}.pt")
hpctrain.fit(model, Levels(40, 0), Levels(20, 1), output_dir=out, run_name="fsdp",
             tensorboard=False, parallel={"strategy": "fsdp"},
             optim={"name": "sgd", "lr": 1e-12, "momentum": 0, "weight_decay": 0},
             data={"images": {"image_size": 16}, "num_workers": 0},
             train={"max_steps": 1, "global_batch_size": 20})
'''


@pytest.mark.distributed
def test_under_fsdp_every_process_trains_rank_0_s_initial_weights(tmp_path):
    """Each process of a script builds its own model; unseeded, they differ. FSDP shards
    without syncing: hpctrain gives every rank rank 0's weights first (DDP does it itself)."""
    import torch.distributed.checkpoint as dcp

    from hpctrain.runs.directory import list_checkpoints

    script = tmp_path / "rank_seeded.py"
    script.write_text(RANK_SEEDED)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), str(tmp_path)], capture_output=True, text=True, timeout=240,
        env=one_thread_env(PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent),
                                                       os.environ.get("PYTHONPATH", "")])))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    first, second = (torch.load(tmp_path / f"init-{rank}.pt") for rank in (0, 1))
    assert any(not torch.equal(first[k], second[k]) for k in first)
    [checkpoint] = list_checkpoints(tmp_path / "fsdp" / "checkpoints")
    state = {"model": {k: torch.empty_like(v) for k, v in first.items()}}
    dcp.load(state, checkpoint_id=checkpoint)
    for name, trained in state["model"].items():
        assert torch.allclose(trained, first[name], atol=1e-6), name
