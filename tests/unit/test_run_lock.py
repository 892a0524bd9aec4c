"""One run directory, one run: runs/lock.py and the run directory's claim
(train/checkpoints/run_place.py).

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_run_lock.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.runs import directory
from hpctrain.runs.directory import RunDir
from hpctrain.runs.lock import STALE_SECONDS, Holder, RunInUse, _set_aside, claim, claim_new
from hpctrain.train.checkpoints import run_place


def _write_lock(run: Path, beat_age: float = 0.0, damaged: bool = False, **holder) -> Path:
    """A lock as another run left it (cut short when `damaged`), its heartbeat `beat_age`
    seconds old."""
    run.mkdir(parents=True, exist_ok=True)
    record = {"pid": 1, "host": "elsewhere", "job_id": None, "restart": 0,
              "started": time.time() - beat_age, **holder}
    path = RunDir(run).lock
    path.write_text("{cut" if damaged else json.dumps(record))
    os.utime(path, (time.time() - beat_age,) * 2)
    return path


def test_two_runs_started_in_the_same_second_get_two_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(directory, "stamp", lambda: "20261125-120000")  # the same second
    config = load_config("default", [f"output_dir={tmp_path / 'runs'}"])
    first, second = run_place.resolve_run(config), run_place.resolve_run(config)
    try:
        assert first.run_dir != second.run_dir
        assert second.run_dir.name == f"{first.run_dir.name}-2"
        assert first.run_dir.is_dir() and RunDir(second.run_dir).lock.is_file()
    finally:
        second.lock.release(), first.lock.release()
    assert not (tmp_path / "runs").exists()  # released empty: nothing left behind


@pytest.mark.parametrize("lock, me, taken", [
    # another host, heartbeat fresh: it may be alive
    ({}, {}, None),
    # another host, heartbeat silent too long: its node died
    ({"beat_age": STALE_SECONDS + 60}, {}, "heartbeat stopped"),
    # an earlier start of this Slurm job: Slurm requeues only a job that ended
    ({"job_id": "77", "restart": 0}, {"job_id": "77", "restart": 1}, "requeued since"),
    # the same start of the same job (two runs in one batch script): not gone
    ({"job_id": "77", "restart": 1}, {"job_id": "77", "restart": 1}, None),
    # a lock cut short: judged by its heartbeat alone
    ({"damaged": True}, {}, None),
    ({"damaged": True, "beat_age": STALE_SECONDS + 60}, {}, "heartbeat stopped"),
])
def test_which_holders_are_taken_for_gone(tmp_path, lock, me, taken):
    run = tmp_path / "run"
    _write_lock(run, **lock)
    if taken is None:
        with pytest.raises(RunInUse, match="is in use by"):
            claim(run, me.get("job_id"), me.get("restart", 0), "run_name=run")
        return
    held = claim(run, me.get("job_id"), me.get("restart", 0), "run_name=run")
    try:
        assert taken in held.taken_over
        assert Holder.read(held.path).pid == os.getpid()
    finally:
        held.release()


def test_a_lock_another_run_took_over_first_is_put_back(tmp_path):
    stale = _write_lock(tmp_path / "run", beat_age=STALE_SECONDS + 60)
    judged, beat = Holder.read(stale), stale.stat().st_mtime
    winner = claim(tmp_path / "run", None, 0, "run_name=run")  # took it over first
    try:
        assert not _set_aside(stale, judged, beat)  # the late one finds the winner's lock
        assert Holder.read(winner.path).pid == os.getpid() and winner.path.is_file()
        assert [p.name for p in (tmp_path / "run").iterdir()] == ["run.lock"]
    finally:
        winner.release()


def test_a_copy_on_another_rank_does_not_release_the_lock(tmp_path):
    import pickle

    held = claim_new(tmp_path, "run", None, 0)
    try:
        pickle.loads(pickle.dumps(held)).release()
        assert held.path.is_file()
    finally:
        held.release()
    assert not held.path.exists()


def test_a_file_system_without_hard_links_still_locks_exclusively(tmp_path, monkeypatch):
    def no_links(*_):
        raise PermissionError(1, "Operation not permitted")  # what such a mount answers
    monkeypatch.setattr("hpctrain.runs.lock.os.link", no_links)
    held = claim(tmp_path / "run", None, 0, "run_name=run")
    try:
        assert Holder.read(held.path).pid == os.getpid()
        with pytest.raises(RunInUse, match="is in use by"):
            claim(tmp_path / "run", "7", 0, "run_name=run")  # this process: alive
    finally:
        held.release()
