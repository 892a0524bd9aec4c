"""DataLoaders where hpctrain expected Datasets (issue 53, items 2 and 4): the tests that start
several processes or a server (torchrun, Slurm, PostgreSQL, the browser, the model hub) (the
others are tests/unit/test_given_loaders.py, tests/runs/test_given_loaders.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launching import one_thread_env


FIXTURE = Path(__file__).parent.parent / "fixtures" / "lit_classifier.py"
sys.path.insert(0, str(FIXTURE.parent))


SCRIPT = """\
import sys
sys.path.insert(0, {folder!r})
import torch, hpctrain
from torch.utils.data import DataLoader
from text_data import Sentences, TextClassifier, pad_collate

if __name__ == "__main__":
    torch.manual_seed(0)
    hpctrain.fit(TextClassifier(),
                 DataLoader(Sentences(400, 0), batch_size=16, shuffle=True,
                            collate_fn=pad_collate),
                 DataLoader(Sentences(100, 1), batch_size=32, collate_fn=pad_collate),
                 output_dir={runs!r}, run_name="two", train={{"epochs": 1}},
                 optim={{"name": "adamw", "lr": 0.003}}, tensorboard=False, report=False)
"""


@pytest.mark.distributed
def test_two_processes_split_a_shuffled_loader_as_lightning_does(tmp_path):
    """The variable-length text classifier through fit, its DataLoaders with its pad collate,
    on 2 processes: 400 samples, batch 16 on each, each rank takes 200 of one order and
    runs 13 steps (the last batch of 8), as DistributedSampler with drop_last=False does."""
    script = tmp_path / "fit_loaders.py"
    script.write_text(SCRIPT.format(folder=str(FIXTURE.parent), runs=str(tmp_path / "runs")))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script)], capture_output=True, text=True,
                          timeout=240, env=one_thread_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "your DataLoader's order split over 2 processes: each takes one sample in 2 of " \
           "one epoch-seeded order (as Lightning's DistributedSampler)" in done.stdout
    assert "collate pad_collate" in done.stdout
    summary = json.loads((tmp_path / "runs" / "two" / "summary.json").read_text())
    assert summary["steps"] == 13 and summary["status"] == "completed"
    assert summary["final_val_accuracy"] > 0.6
