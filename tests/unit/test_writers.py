"""The files hpctrain writes are written whole, through fresh files of their own, and never
through a link (issue 51): each write refuses or replaces a link planted after the run
directory was checked, not only the check at the start."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpctrain.errors import OutputError
from hpctrain.runs.identity import Heartbeat
from hpctrain.train.telemetry import write_summary
from hpctrain.writers import open_appending, open_fresh, own_folder, write_whole


@pytest.fixture
def victim(tmp_path) -> Path:
    outside = tmp_path / "outside" / "precious.txt"
    outside.parent.mkdir()
    outside.write_text("precious")
    return outside


def test_a_link_at_the_final_name_is_replaced_not_written_through(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").symlink_to(victim)
    (run / "summary.json.tmp").symlink_to(victim)  # the temporary name of old
    write_summary(run, {"status": "completed"})
    assert victim.read_text() == "precious"
    assert not (run / "summary.json").is_symlink()
    assert '"completed"' in (run / "summary.json").read_text()
    assert sorted(p.name for p in run.iterdir()) == ["summary.json", "summary.json.tmp"]


def test_a_failed_write_leaves_the_old_file_and_no_partial(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("old")

    class Unwritable(str):  # a full disk, as the write meets it
        def encode(self, *args):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_whole(path, Unwritable("new"))
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_an_appended_file_or_a_folder_that_is_a_link_is_refused(tmp_path, victim):
    (tmp_path / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(OutputError, match=r"metrics.jsonl is a symbolic link \(to .*precious"):
        open_appending(tmp_path / "metrics.jsonl")
    (tmp_path / "checkpoints").symlink_to(victim.parent)
    with pytest.raises(OutputError, match="checkpoints is a symbolic link"):
        own_folder(tmp_path / "checkpoints")
    assert victim.read_text() == "precious" and len(list(victim.parent.iterdir())) == 1
    with open_appending(tmp_path / "new.jsonl") as appended:
        appended.write("a\n")
    assert (tmp_path / "new.jsonl").read_text() == "a\n"


def test_a_checkpoint_folder_made_a_link_mid_run_receives_nothing(tmp_path, victim):
    """checkpoints/ swapped for a link after the run started: the next save is refused,
    one line, and the folder outside stays as it was."""
    import torch

    from hpctrain.cluster.environment import detect
    from hpctrain.parallel.processes import Distributed
    from hpctrain.train.checkpoints.checkpoint import Checkpointer

    folder = tmp_path / "run" / "checkpoints"
    saver = Checkpointer(folder, 2, Distributed(detect({}), "none", hosts=("here",)), False)
    saver.save(1, {"w": torch.ones(2)}, {})
    folder.rename(tmp_path / "moved")
    folder.symlink_to(victim.parent)
    with pytest.raises(OutputError, match="checkpoints is a symbolic link"):
        saver.save(2, {"w": torch.ones(2)}, {})
    assert [p.name for p in victim.parent.iterdir()] == ["precious.txt"]


def test_the_heartbeat_touches_a_link_not_what_it_points_to(tmp_path, victim):
    before = victim.stat().st_mtime_ns
    os.utime(victim, ns=(before - 10**10, before - 10**10))
    (tmp_path / "run.json").symlink_to(victim)
    beat = Heartbeat(tmp_path / "run.json", every=0.01).start()
    try:
        time.sleep(0.1)
    finally:
        beat.stop()
    assert victim.stat().st_mtime_ns == before - 10**10


def test_a_log_a_child_writes_is_fresh_and_a_link_at_its_name_is_replaced(tmp_path, victim):
    """Issue 69: a scale study's `gpus-1.log` and an autotune trial's log were opened with
    open(path, "w"), truncating and replacing the file a planted link pointed to."""
    log = tmp_path / "gpus-1.log"
    log.symlink_to(victim)
    with open_fresh(log) as out:
        out.write("size 1\n")
    assert victim.read_text() == "precious" and not log.is_symlink()
    assert log.read_text() == "size 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus-1.log", "outside"]


def test_an_autotune_trial_refuses_a_logs_folder_that_is_a_link(tmp_path, victim):
    """Before any process starts: nothing is written where the link points."""
    from hpctrain.autotune.trials import LOGS, Plan, Trial, run_trial

    (tmp_path / LOGS).symlink_to(victim.parent)
    with pytest.raises(OutputError, match="logs is a symbolic link"):
        run_trial(Plan("default", [], tmp_path), Trial(1, {}, []), 10, 60)
    assert [p.name for p in victim.parent.iterdir()] == ["precious.txt"]
