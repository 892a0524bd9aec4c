"""hpctrain memory: the tests that start several processes or a server (torchrun, Slurm,
PostgreSQL, the browser, the model hub) (the others are tests/unit/test_memory.py,
tests/runs/test_memory.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launching import one_thread_env



@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_find_batch_size_on_two_ranks_agrees(tmp_path, shapes_cache, strategy):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "-m", "hpctrain", "memory", "default", "device=cpu",
               f"output_dir={tmp_path}", "data.dataset=synthetic", "data.images.image_size=16",
               "model.name=hpctrain:tiny_cnn", "train.global_batch_size=128",
               f"parallel.strategy={strategy}", "--gpu-memory", "1MiB", "--find-batch-size",
               "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env=one_thread_env())
    assert done.returncode == 0, done.stderr[-3000:]
    search = json.loads(done.stdout)["search"]  # printed once, by rank 0
    assert search["world_size"] == 2 and search["strategy"] == strategy
    assert search["largest"] >= 8 and any(not t["fits"] for t in search["trials"])
    assert search["recommended"] * 2 * search["grad_accum_steps"] == 128
