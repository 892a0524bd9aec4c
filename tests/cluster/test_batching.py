"""Your batches as you make them (issue 53): the tests that start several processes or a server
(torchrun, Slurm, PostgreSQL, the browser, the model hub) (the others are
tests/runs/test_batching.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


FIXTURE = Path(__file__).parent.parent / "fixtures" / "text_data.py"
sys.path.insert(0, str(FIXTURE.parent))
from recipes import text_recipe
from launching import one_thread_env, records


@pytest.mark.distributed
def test_a_recipe_with_data_collate_trains_on_one_process_and_two(tmp_path):
    """The same global batch on one process and split over two torchrun processes on gloo
    (each rank pads its own share): the same validation figures."""
    recipe = text_recipe(tmp_path)
    figures = {}
    for processes in (1, 2):
        command = [sys.executable, "-m", "hpctrain", "run", str(recipe), f"run_name=p{processes}"]
        if processes > 1:
            command[1:3] = ["-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={processes}", "-m", "hpctrain"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                              env=one_thread_env())  # as torchrun sets
        assert done.returncode == 0, done.stderr[-2000:]
        figures[processes] = records(tmp_path / "runs" / f"p{processes}", "eval")[-1]
    assert figures[1]["val_accuracy"] > 0.85
    assert figures[2]["val_accuracy"] == pytest.approx(figures[1]["val_accuracy"], abs=1 / 256)
