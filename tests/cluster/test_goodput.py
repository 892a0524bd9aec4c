"""`hpctrain goodput` (issue 55, first part): the tests that start several processes or a
server (torchrun, Slurm, PostgreSQL, the browser, the model hub) (the others are
tests/unit/test_goodput.py, tests/runs/test_goodput.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launching import one_thread_env



@pytest.mark.distributed
def test_two_processes_pace_their_saves_alike(tiny, tmp_path):
    """checkpoint.every=auto under two torchrun processes on gloo: a save is collective, so
    both must choose the same steps; they do, from figures gathered from both: the first
    save at the first epoch's end, the next (the measured save's Daly interval being far
    longer than the run) at its last step."""

    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "hpctrain", "run", "default",
         *tiny("run_name=paced", "train.global_batch_size=32", "train.epochs=3",
               "checkpoint.every=auto", "preemption.deadline=null")],
        capture_output=True, text=True, timeout=240, env=one_thread_env())
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "paced"
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == [
        "step_00000005", "step_00000015"]
    chosen = json.loads((run / "summary.json").read_text())["checkpoint_interval"]
    assert chosen["save_seconds"] > 0 and chosen["steps"] > 15
