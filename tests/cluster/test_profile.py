"""hpctrain profile: the tests that start several processes or a server (torchrun, Slurm,
PostgreSQL, the browser, the model hub) (the others are tests/unit/test_profile.py,
tests/runs/test_profile.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launching import one_thread_env



@pytest.mark.distributed
def test_two_torchrun_ranks_each_write_a_trace_and_rank_0_reads_both(tmp_path, shapes_cache):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "-m", "hpctrain", "profile", "default",
               f"output_dir={tmp_path}", "data.dataset=synthetic", "data.images.image_size=16",
               "data.num_workers=0", "model.name=hpctrain:tiny_cnn", "train.batch_size=16",
               "tensorboard=false", "--steps", "2", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env=one_thread_env())
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # printed once, by rank 0
    assert [Path(t).name for t in report["traces"]] == ["trace.rank0.json.gz",
                                                        "trace.rank1.json.gz"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["steps"] == 2 for r in report["ranks"])
    # the stop flag's read (a CPU tensor of the control group) is found with its call site
    sites = report["ranks"][0]["sync"]["sites"]
    assert any("hpctrain/parallel/processes.py" in (s["call_site"] or "") for s in sites)
