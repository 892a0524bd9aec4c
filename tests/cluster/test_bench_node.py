"""`hpctrain bench node` on the CPU: the tests that start several processes or a server
(torchrun, Slurm, PostgreSQL, the browser, the model hub) (the others are
tests/unit/test_bench_node.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launching import one_thread_env


FIXTURES = Path(__file__).parent.parent / "fixtures"

QUICK = ["--size", "256", "--megabytes", "16", "--seconds", "0.05"]


@pytest.mark.distributed
def test_under_torchrun_it_measures_the_all_reduce_between_the_processes():
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "hpctrain", "bench", "node", *QUICK,
                           "--json"], capture_output=True, text=True, timeout=300,
                          env=one_thread_env())
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)["rows"]
    (reduce,) = [r for r in rows if r["group"] == "all-reduce"]
    assert reduce["name"] == "gloo x 2" and reduce["unit"] == "GB/s" and reduce["value"] > 0
    assert reduce["note"] == "bus bandwidth, 16 MB fp32"


@pytest.mark.distributed
def test_ranks_whose_clocks_disagree_call_the_all_reduce_equally_often(tmp_path):
    """Each rank timing its own loop let one leave while the other waited in one more
    all-reduce forever (a suite run hung here for 300 s); the count is agreed first."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(FIXTURES / "collective_timing.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=one_thread_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(float((tmp_path / f"rank{r}.txt").read_text()) > 0 for r in (0, 1))
