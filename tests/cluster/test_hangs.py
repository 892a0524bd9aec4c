"""A run that stops making progress is found, named and ended with the exit code that asks for
a requeue (issue 65): the tests that start several processes or a server (torchrun, Slurm,
PostgreSQL, the browser, the model hub) (the others are tests/unit/test_hangs.py,
tests/runs/test_hangs.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import ExitCode
from launching import one_thread_env

FIXTURES = Path(__file__).parent.parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from hangs import recipe  # noqa: E402


@pytest.mark.slow
@pytest.mark.distributed
def test_one_of_two_ranks_stuck_before_a_collective_is_named_by_rank(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "-m", "hpctrain", "run", str(recipe(tmp_path)),
               "model.kwargs.hang_at=6", "model.kwargs.rank=1", "monitor.hang_after=4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env=one_thread_env())
    run_dir, = (tmp_path / "runs").iterdir()
    assert done.stderr.count(f"exitcode  : {int(ExitCode.HUNG)}") == 2, done.stderr[-3000:]
    line = json.loads((run_dir / "hang" / "hang.json").read_text())["line"]
    assert line.startswith("hung in training step 6: no progress for 4 s")
    assert "rank 1 hangs in your code at " in line and "in _forever" in line
    assert "rank 0 waits for rank 1 in a collective (torch code at " in line
    for rank in (0, 1):
        assert json.loads((run_dir / "hang" / f"rank-{rank}.json").read_text())["rank"] == rank
