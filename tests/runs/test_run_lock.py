"""One run directory, one run: the tests that train, in this process or in an `hpctrain`
process of their own (the others are tests/unit/test_run_lock.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


from hpctrain.runs.directory import RunDir
from hpctrain.runs.lock import Holder

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
