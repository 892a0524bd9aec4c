"""The runs index on real SQLite and a real PostgreSQL server: the tests that start several
processes or a server (torchrun, Slurm, PostgreSQL, the browser, the model hub) (the others
are tests/unit/test_runs_index.py, tests/runs/test_runs_index.py)."""

import json
import os
import shutil
import time
from pathlib import Path


from hpctrain.runs.database import open_database
from hpctrain.runs.identity import remember_tracker
from hpctrain.runs.index import Index
from hpctrain.runs.scan import LOST_AFTER_SECONDS
from hpctrain.train.telemetry import write_summary
from run_fleet import NOW, make_run, noon, refreshed


def test_the_leaderboard_ranks_the_time_to_target(db_url, fleet):
    index = refreshed(db_url, fleet)
    board = index.leaderboard("resnet", "val_accuracy", 0.94, higher=True)
    assert [(r["name"], r["step"]) for r in board["reached"]] == [("a2", 50), ("a1", 200)]
    first = board["reached"][0]
    assert (first["elapsed_seconds"], first["device_hours"], first["energy_joules"]) == \
        (300, 0.5, 3.6e6)
    assert [(r["name"], r["best"]) for r in board["missed"]] == [("b1", 0.80)]
    lower = index.leaderboard("gpt", "val_loss", 2.8, higher=False)
    assert [r["name"] for r in lower["reached"]] == ["b2"]
    assert [r["name"] for r in lower["missed"]] == ["b3"]


def test_rows_hold_the_job_chain_status_and_figures(db_url, fleet):
    index = refreshed(db_url, fleet)
    rows = {r["name"]: r for r in index.runs()}
    assert json.loads(rows["a1"]["jobs"]) == ["11", "12"]
    assert rows["a1"]["gpu_model"] == "NVIDIA A100" and rows["a1"]["gpu_count"] == 4
    assert rows["a1"]["best_metric"] == "best_val_accuracy" and rows["a1"]["best_value"] == 0.95
    assert rows["b3"]["status"] == "lost" and rows["b3"]["device_hours"] == 0.25
    assert [r["name"] for r in index.runs(status="lost")] == ["b3"]
    assert [r["name"] for r in index.runs(user="alice")] == ["a2", "a1"]  # newest first
    assert [r["name"] for r in index.runs(since=noon("2026-11-11"))] == ["b3", "b2"]
    assert index.find("a2")["user_name"] == "alice"
    assert index.find(str(fleet / "b1"))["status"] == "failed"


def test_a_refresh_rereads_only_what_changed_and_follows_a_moved_run(db_url, fleet, tmp_path):
    index = Index(open_database(db_url))
    assert index.refresh([fleet]).read == 5
    again = index.refresh([fleet])
    assert (again.read, again.unchanged) == (0, 5)
    summary = fleet / "a1" / "summary.json"
    (fleet / "a1" / "summary.json.tmp").write_text(  # as a run writes it: by renaming
        summary.read_text().replace('"completed"', '"preempted"'))
    os.replace(fleet / "a1" / "summary.json.tmp", summary)
    assert index.refresh([fleet]).read == 1
    assert index.find("a1")["status"] == "preempted"
    # a finished run's folder unchanged: not even listed; a file changed in place is seen
    # by a rescan only
    with open(fleet / "a2" / "metrics.jsonl", "a") as metrics:
        metrics.write(json.dumps({"kind": "eval", "step": 150, "val_accuracy": 0.99}) + "\n")
    assert index.refresh([fleet]).read == 0
    assert index.refresh([fleet], rescan=True).read == 1
    elsewhere = tmp_path / "scratch"
    elsewhere.mkdir()
    shutil.move(fleet / "a2", elsewhere / "a2")
    index.refresh([fleet, elsewhere])
    rows = index.runs()
    assert len(rows) == 5  # found again, not duplicated
    assert index.find("a2")["path"] == str(elsewhere / "a2")
    shutil.rmtree(fleet / "b2")
    index.refresh([fleet, elsewhere])
    gone = index.find("b2")
    assert gone["status"] == "missing" and "no longer exists" in gone["problem"]


def _remembered(index: Index) -> set[str]:
    return {row["path"] for row in index.db.rows("SELECT path FROM folders")}


def _settle(*folders: Path) -> None:
    """Folders last changed a minute ago: older than RACY_SECONDS, so a listing keeps them."""
    for folder in folders:
        os.utime(folder, (time.time() - 60, time.time() - 60))


def test_an_unchanged_folder_of_finished_runs_is_skipped_and_a_runs_writes_are_seen(db_url,
                                                                                   fleet):
    """A folder of runs whose time is the one the last refresh listed holds the same runs: its
    finished runs are not looked at (a summary replaced by hand is seen by --rescan only).
    A run that starts again or ends touches the folder holding it (directory.mark_changed),
    so the next refresh reads it; a folder changed within RACY_SECONDS of a listing is listed
    again by the next refresh."""
    index = Index(open_database(db_url))
    assert index.refresh([fleet]).read == 5
    assert _remembered(index) == set()  # just made: too recent to be relied on
    _settle(fleet)
    assert index.refresh([fleet]).unchanged == 5
    assert _remembered(index) == {str(fleet)}
    summary = fleet / "a1" / "summary.json"
    (fleet / "a1" / "summary.json.tmp").write_text(
        summary.read_text().replace('"completed"', '"preempted"'))
    os.replace(fleet / "a1" / "summary.json.tmp", summary)  # by hand: no mark
    again = index.refresh([fleet])
    assert (again.read, again.unchanged) == (0, 5)
    assert index.find("a1")["status"] == "completed"
    remember_tracker(fleet / "a2", "mlflow", "r-7")  # run.json replaced, as at a start
    after = index.refresh([fleet])
    assert after.read == 2  # a2, and a1 whose folder changed: listed now
    assert index.find("a1")["status"] == "preempted"
    assert _remembered(index) == set()  # touched just now: listed again next time
    _settle(fleet)
    index.refresh([fleet])
    write_summary(fleet / "b1", {"status": "completed", "device_hours": 3.0})
    assert index.refresh([fleet]).read == 1
    assert index.find("b1")["status"] == "completed"
    assert index.refresh([fleet], rescan=True).read == 0


def test_a_sweeps_element_that_ends_is_seen_in_an_unchanged_output_directory(db_url, fleet):
    """A sweep's elements live one folder down: the one ending touches the sweep's folder,
    which the refresh checks even where the output directory itself is unchanged."""
    sweep = fleet / "sweep"
    for n in (1, 2):
        make_run(sweep, f"e{n}", "carla", "resnet", "jz", "2026-11-21", 1, "completed", 0.1,
                 None, [(10, "val_accuracy", 0.5, 60, 0.1, None)])
    (sweep / "job.sbatch").write_text("#!/bin/bash\n")
    index = Index(open_database(db_url))
    assert index.refresh([fleet]).read == 7
    _settle(sweep, fleet)
    index.refresh([fleet])
    assert _remembered(index) == {str(fleet), str(sweep)}
    write_summary(sweep / "e2", {"status": "failed", "device_hours": 0.2})
    refreshed_now = index.refresh([fleet])
    assert (refreshed_now.read, refreshed_now.unchanged) == (1, 6)
    assert index.find("e2")["status"] == "failed"
    assert _remembered(index) == {str(fleet)}
    shutil.rmtree(sweep / "e1")  # a folder removed changes the folder that held it
    index.refresh([fleet])
    assert index.find("e1")["status"] == "missing"


def test_damaged_and_half_written_runs_are_listed_as_such(db_url, fleet):
    (fleet / "torn").mkdir()
    (fleet / "torn" / "summary.json").write_text('{"status": "compl')
    (fleet / "torn" / "config.yaml").write_text("name: resnet\n")
    (fleet / "started").mkdir()  # crashed before its first report, long ago
    (fleet / "started" / "config.yaml").write_text("name: resnet\n")
    (fleet / "started" / "metrics.jsonl").write_text('{"kind": "train", "step": 2}\n{"kind": "tr')
    old = NOW - 3 * LOST_AFTER_SECONDS
    for file in (fleet / "started").iterdir():
        os.utime(file, (old, old))
    (fleet / "queued").mkdir()
    (fleet / "queued" / "job.sbatch").write_text("#!/bin/bash\n")
    (fleet / "not-a-run").mkdir()
    (fleet / "not-a-run" / "notes.txt").write_text("x")
    rows = {r["name"]: r for r in refreshed(db_url, fleet).runs()}
    assert rows["torn"]["status"] == "damaged" and "summary.json" in rows["torn"]["problem"]
    assert rows["started"]["status"] == "lost"
    assert "1 line(s) of metrics.jsonl unreadable" in rows["started"]["problem"]
    assert rows["queued"]["status"] == "submitted"
    assert "not-a-run" not in rows and len(rows) == 8


def test_an_index_of_another_version_or_a_damaged_file(tmp_path, fleet, postgres, run_cli,
                                                       private_state):
    """An SQLite index of another schema is rebuilt from the run directories; a shared
    PostgreSQL one is left alone (exit 2, saying why); a file that is not a database is
    named, with the fix."""
    import sqlite3

    import psycopg

    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as connection:
        connection.execute("CREATE TABLE schema_version (version INTEGER)")
        connection.execute("INSERT INTO schema_version VALUES (0)")
        connection.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, path TEXT)")
    assert len(refreshed(str(old), fleet).runs()) == 5
    with psycopg.connect(postgres.url, autocommit=True) as connection:
        connection.execute("CREATE DATABASE old_schema")
    url = postgres.url.rsplit("/", 1)[0] + "/old_schema"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE TABLE schema_version (version INTEGER)")
        connection.execute("INSERT INTO schema_version VALUES (0)")
        connection.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, path TEXT)")
    code, _, err = run_cli("runs", "--db", url)
    assert code == 2 and "another hpctrain version (schema 0" in err
    with psycopg.connect(url) as connection:  # left as it was: not even marked
        assert {row[0] for row in connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = "
            "current_schema()")} == {"schema_version", "runs"}
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database, " * 100)
    code, _, err = run_cli("runs", "--db", str(junk))
    assert code == 2 and str(junk) in err and "can be removed" in err
