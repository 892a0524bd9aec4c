"""One run directory, one run: runs/lock.py and the run directory's claim
(train/checkpoints/run_place.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.config import load_config
from hpctrain.runs import directory
from hpctrain.runs.directory import RunDir
from hpctrain.runs.lock import STALE_SECONDS, Holder, RunInUse, _set_aside, claim, claim_new
from hpctrain.train.checkpoints import run_place

HOLD = """
import sys, time
from pathlib import Path
from hpctrain.runs.lock import claim
lock = claim(Path(sys.argv[1]), None, 0, "test")
print("held", flush=True)
time.sleep(600)
"""


def _holder(run: Path) -> subprocess.Popen:
    """Another process on this host that holds `run`'s lock until killed."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "held"
    return process


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


def test_racing_processes_never_share_a_new_run_directory(tmp_path):
    race = ("import sys; from pathlib import Path; from hpctrain.runs.lock import claim_new\n"
            "for _ in range(25): print(claim_new(Path(sys.argv[1]), 'same', None, 0).run_dir)")
    processes = [subprocess.Popen([sys.executable, "-c", race, str(tmp_path)],
                                  stdout=subprocess.PIPE, text=True) for _ in range(3)]
    claimed = [line for p in processes for line in p.communicate()[0].split()]
    assert len(claimed) == 75 and len(set(claimed)) == 75


def test_a_named_run_in_use_is_refused_naming_the_process_then_taken_over_once_it_dies(
        tmp_path, run_cli, tiny):
    run = tmp_path / "runs" / "mine"
    holder = _holder(run)
    try:
        for resume in ([], ["resume=auto"]):
            code, _, err = run_cli("run", "default", *tiny("run_name=mine", *resume))
            assert code == 2 and f"process {holder.pid} on host {socket.gethostname()}" in err
            assert "is in use by" in err and "Traceback" not in err
            assert not (run / "metrics.jsonl").exists()  # the running run's folder untouched
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert RunDir(run).lock.is_file()  # a killed run leaves its lock behind
    code, out, _ = run_cli("run", "default", *tiny("run_name=mine", "train.max_steps=2"))
    assert code == 0, out
    assert f"process {holder.pid} on {socket.gethostname()} has ended" in out
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert not RunDir(run).lock.exists()  # released at the run's end


def test_a_run_that_cannot_start_releases_its_directory(tmp_path, run_cli, tiny):
    code, _, _ = run_cli("run", "default", *tiny("run_name=mine", "train.batch_size=1000"))
    assert code == 2
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs" / "kept").mkdir(parents=True)
    (tmp_path / "runs" / "kept" / "notes.txt").write_text("mine")
    code, _, _ = run_cli("run", "default", *tiny("run_name=kept", "train.batch_size=1000"))
    assert code == 2 and (tmp_path / "runs" / "kept" / "notes.txt").read_text() == "mine"
    assert not RunDir(tmp_path / "runs" / "kept").lock.exists()


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


def test_parts_built_without_a_run_keep_their_directory_but_not_the_lock(tiny_config):
    """Tests and benchmarks drive the parts themselves: the lock ends with the build, the
    directory stays for what they write (under torchrun every rank writes there: removing it
    raced with the other rank's first file)."""
    from hpctrain.train.build import build_parts

    parts = build_parts(tiny_config("run_name=driven"))
    assert parts.run_dir.is_dir() and not RunDir(parts.run_dir).lock.exists()


def test_status_of_a_run_directory_says_where_it_stands_and_who_holds_it(tmp_path, run_cli,
                                                                         tiny):
    """`hpctrain status RUN_DIR` (issue 51; before: "'scontrol' is not on PATH" for any
    local run): a finished run's state, steps and restarts; a run held by a living process
    names it; one whose heartbeat stopped long ago is lost; anything else is one line."""
    assert run_cli("run", "default", *tiny("run_name=seen", "train.max_steps=2"))[0] == 0
    run = tmp_path / "runs" / "seen"
    code, out, err = run_cli("status", str(run), "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["state"] == "completed" and status["steps"] == 2
    assert status["restarts"] == 0 and status["source"] == "run directory"
    assert status["best_val_accuracy"] is not None and status["held_by"] is None

    (run / "summary.json").unlink()  # as while it trains: no summary yet, its lock held
    me = Holder.this_process(None, 0)
    (run / "run.lock").write_text(json.dumps(me.__dict__))
    code, out, _ = run_cli("status", str(run))
    assert code == 0 and "state      running" in out
    assert f"held_by    process {os.getpid()} on host {socket.gethostname()}" in out
    long_ago = time.time() - 86400
    for name in ("run.json", "metrics.jsonl"):
        os.utime(run / name, (long_ago, long_ago))
    code, out, _ = run_cli("status", str(run), "--json")
    assert code == 0 and json.loads(out)["state"] == "lost"
    code, _, err = run_cli("status", str(tmp_path / "nowhere"))
    assert code == 2 and "neither a run directory nor a job id" in err
