"""The runs index on real SQLite and a real PostgreSQL server: a hand-computed set of run
directories gives the same usage and leaderboard on both; refreshes are incremental; damaged,
half-written, moved and silent runs are listed as what they are."""

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain.runs.database import open_database
from hpctrain.runs.identity import remember_tracker
from hpctrain.runs.index import Index
from hpctrain.runs.scan import LOST_AFTER_SECONDS, scan_run
from hpctrain.train.telemetry import write_summary

NOW = time.time()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """A fresh, empty index: an SQLite file, or a new database on the session's server."""
    if request.param == "sqlite":
        return str(tmp_path / "index.sqlite")
    import psycopg

    server = request.getfixturevalue("postgres")
    name = f"t{os.getpid()}_{abs(hash(tmp_path)) % 10**8}"
    with psycopg.connect(server.url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return server.url.rsplit("/", 1)[0] + f"/{name}"


def noon(day: str) -> float:
    """Mid-day of a date, so the month is the same in every time zone."""
    return time.mktime(time.strptime(f"{day} 12:00", "%Y-%m-%d %H:%M"))


def make_run(root: Path, name: str, user: str, recipe: str, cluster: str, day: str, gpus: int,
             status: str | None, device_hours: float, energy: float | None,
             evals: list[tuple], jobs: tuple = (), heartbeat: float | None = None,
             split: tuple[float, float] | None = None) -> Path:
    """A run directory as hpctrain writes it. evals: (step, metric, value, elapsed seconds,
    device-hours, joules); split: each job's (seconds, training seconds), the rest start-up
    (none: a run of an hpctrain before the split)."""
    run = root / name
    run.mkdir(parents=True)
    started = noon(day)
    (run / "config.yaml").write_text(f"name: {recipe}\ntrain:\n  batch_size: {gpus * 32}\n")
    (run / "run.json").write_text(json.dumps({
        "run_id": f"id-{name}", "name": name, "recipe": recipe, "created": started,
        "user": user, "cluster": cluster, "git_commit": "abc123", "config_hash": "f" * 16,
        "starts": [{"time": started, "job_id": job, "world_size": max(gpus, 1),
                    "hosts": ["n1"], "gpu_model": "NVIDIA A100" if gpus else None,
                    "gpus": gpus, **({"seconds": split[0], "split": {
                        "startup": split[0] - split[1], "training": split[1], "steps": 100}}
                        if split else {})} for job in (jobs or (None,))]}))
    lines = [json.dumps({"kind": "eval", "step": step, "time": started + elapsed, metric: value,
                         "elapsed_seconds": elapsed, "device_hours": hours,
                         "energy_joules": joules})
             for step, metric, value, elapsed, hours, joules in evals]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    if status is not None:
        best = max(v for _, m, v, *_ in evals if m == "val_accuracy") if any(
            e[1] == "val_accuracy" for e in evals) else None
        (run / "summary.json").write_text(json.dumps({
            "status": status, "device_hours": device_hours, "energy_joules": energy,
            "best_val_accuracy": best, "steps": evals[-1][0] if evals else 0,
            "device": "NVIDIA A100" if gpus else "cpu", "world_size": max(gpus, 1),
            "energy_source": "nvml-counter" if energy else "not measured"}))
    beat = heartbeat if heartbeat is not None else started + 3600
    for file in run.iterdir():
        os.utime(file, (beat, beat))
    if status is not None:
        os.utime(run / "summary.json", (beat + 10, beat + 10))
    return run


@pytest.fixture
def fleet(tmp_path) -> Path:
    """Five runs whose usage and race are computed by hand in the tests."""
    root = tmp_path / "runs"
    make_run(root, "a1", "alice", "resnet", "jz", "2026-10-05", 4, "completed", 2.0, 3.6e6,
             [(100, "val_accuracy", 0.90, 600, 1.0, 1.8e6),
              (200, "val_accuracy", 0.95, 1200, 2.0, 3.6e6)], jobs=("11", "12"),
             split=(900.0, 600.0))  # 2 jobs x 900 s x 4 GPUs: its 2.0 device-hours
    make_run(root, "a2", "alice", "resnet", "jz", "2026-11-02", 8, "completed", 1.0, 7.2e6,
             [(50, "val_accuracy", 0.94, 300, 0.5, 3.6e6),
              (100, "val_accuracy", 0.96, 600, 1.0, 7.2e6)], split=(450.0, 405.0))
    make_run(root, "b1", "bob", "resnet", "grete", "2026-11-10", 4, "failed", 3.0, 1.8e6,
             [(100, "val_accuracy", 0.80, 900, 3.0, 1.8e6)])
    make_run(root, "b2", "bob", "gpt", "grete", "2026-11-12", 0, "completed", 0.5, None,
             [(10, "val_loss", 2.5, 1800, 0.5, None)])
    make_run(root, "b3", "bob", "gpt", "grete", "2026-11-20", 2, None, 0, None,  # killed
             [(10, "val_loss", 3.0, 450, 0.25, 0.9e6)], heartbeat=NOW - 2 * LOST_AFTER_SECONDS)
    return root


@pytest.fixture
def private_state(tmp_path, monkeypatch):
    """No output directories remembered but those a test names (other tests' runs stay out)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def refreshed(url: str, *roots: Path) -> Index:
    index = Index(open_database(url))
    index.refresh(list(roots))
    return index


def test_usage_is_what_the_run_directories_say(db_url, fleet):
    index = refreshed(db_url, fleet)
    by_user = {r["key"]: r for r in index.usage("user")}
    assert by_user["alice"]["runs"] == 2 and by_user["bob"]["runs"] == 3
    assert by_user["alice"]["gpu_hours"] == pytest.approx(3.0)
    assert by_user["bob"]["gpu_hours"] == pytest.approx(3.25)  # b2 ran on CPUs
    assert by_user["bob"]["device_hours"] == pytest.approx(3.75)
    assert by_user["alice"]["kwh"] == pytest.approx(3.0)
    assert by_user["bob"]["kwh"] == pytest.approx(0.75)  # b2 not measured: nothing added
    assert by_user["alice"]["failed_share"] == 0
    assert by_user["bob"]["failed_share"] == pytest.approx(2 / 3)  # b1 failed, b3 lost
    by_month = {r["key"]: r for r in index.usage("month")}
    assert by_month["2026-10"]["runs"] == 1 and by_month["2026-11"]["runs"] == 4
    assert by_month["2026-11"]["gpu_hours"] == pytest.approx(4.25)
    assert by_month["2026-11"]["kwh"] == pytest.approx(2.75)
    assert by_month["2026-11"]["failed_share"] == pytest.approx(0.5)
    by_recipe = {r["key"]: r for r in index.usage("recipe")}
    assert by_recipe["resnet"]["gpu_hours"] == pytest.approx(6.0)
    assert by_recipe["resnet"]["kwh"] == pytest.approx(3.5)
    assert {r["key"]: r["runs"] for r in index.usage("cluster")} == {"jz": 2, "grete": 3}
    # goodput: productive device-hours over those of the runs that tell them (bob's none)
    productive = (2 * 600 * 4 + 405 * 8) / 3600
    assert by_user["alice"]["goodput"] == pytest.approx(productive / 3.0)
    assert by_user["bob"]["goodput"] is None
    assert by_recipe["resnet"]["goodput"] == pytest.approx(productive / 3.0)  # b1: no split
    rows = {r["name"]: r for r in index.runs()}
    assert rows["a1"]["goodput"] == pytest.approx(600 / 900)
    assert rows["a1"]["productive_hours"] == pytest.approx(2 * 600 * 4 / 3600)
    assert rows["b1"]["goodput"] is None and rows["b1"]["productive_hours"] is None


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


def _register(url: str, number: int) -> None:
    index = Index(open_database(url))
    row, _ = scan_run(Path(os.environ["FLEET"]) / "a1")
    index.put({**row, "run_id": f"process-{number}", "name": f"p{number}"}, [])


def test_eight_processes_registering_at_once_lose_no_row(db_url, fleet, monkeypatch):
    monkeypatch.setenv("FLEET", str(fleet))
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_register, args=(db_url, n)) for n in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0] * 8
    names = {r["name"] for r in Index(open_database(db_url)).runs()}
    assert names == {f"p{n}" for n in range(8)}


def test_schema_creation_holds_the_sqlite_write_lock(tmp_path, fleet):
    """CREATE TABLE commits on its own in SQLite, so two processes opening a new index could
    both find no schema version and both write one; the next opening then took the index
    for another version's and dropped every run (seen in CI). The write lock is held from
    the version check on, and an index already holding the version twice keeps its runs."""
    import sqlite3

    where = str(tmp_path / "index.sqlite")
    index = refreshed(where, fleet)
    index.db.lock_schema()
    other = sqlite3.connect(where, timeout=0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        other.execute("BEGIN IMMEDIATE")
    index.db.commit()
    other.execute("INSERT INTO schema_version SELECT version FROM schema_version")
    other.commit()
    assert len(Index(open_database(where)).runs()) == 5


def test_the_verbs_print_tables_and_json(fleet, run_cli, tmp_path, private_state):
    db = ["--db", str(tmp_path / "cli.sqlite"), "--root", str(fleet)]
    code, out, _ = run_cli("runs", *db)
    assert code == 0 and "5 run(s)" in out and "lost" in out
    assert "goodput" in out and re.search(r"a1 .* 67% ", out) and re.search(r"a2 .* 90% ", out)
    code, out, _ = run_cli("runs", "usage", "--by", "user", "--json", *db)
    assert code == 0 and {r["key"]: r["runs"] for r in json.loads(out)} == {"alice": 2, "bob": 3}
    code, out, _ = run_cli("runs", "usage", "--by", "user", *db)
    assert code == 0 and re.search(r"alice .* 74%", out) and "goodput" in out
    code, out, _ = run_cli("runs", "leaderboard", "resnet", "--target",
                           "best_val_accuracy=0.94", *db)
    assert code == 0 and out.index("a2") < out.index("a1") and "did not reach it: b1" in out
    code, out, _ = run_cli("runs", "compare", "a1", "a2", "--json", *db)
    compared = json.loads(out)
    assert compared["settings"] == {"train.batch_size": [128, 256]}
    assert compared["figures"]["device_hours"] == [2.0, 1.0]
    code, out, _ = run_cli("runs", "show", "b1", *db)
    assert code == 0 and "failed" in out and "grete" in out


def test_the_listing_shows_the_newest_runs_and_says_when_there_are_more(fleet, run_cli,
                                                                      tmp_path, private_state):
    """`hpctrain runs` lists the newest 50 by default (a centre's index holds 100,000)."""
    db = ["--db", str(tmp_path / "cli.sqlite"), "--root", str(fleet)]
    code, out, _ = run_cli("runs", "--limit", "2", *db)
    assert code == 0 and "the newest 2 runs (more: --limit N, or 0 for every run)" in out
    code, out, _ = run_cli("runs", "--limit", "2", "--json", *db)
    assert len(json.loads(out)) == 2
    code, out, _ = run_cli("runs", "--limit", "0", "--json", *db)
    assert len(json.loads(out)) == 5
    code, out, _ = run_cli("runs", "--limit", "5", *db)
    assert "5 run(s)" in out and "newest" not in out
    code, _, err = run_cli("runs", "--limit", "-1", *db)
    assert code == 2 and "--limit -1" in err


def test_bad_references_and_unreachable_databases_are_exit_2(fleet, run_cli, tmp_path,
                                                              private_state):
    db = ["--db", str(tmp_path / "cli.sqlite"), "--root", str(fleet)]
    code, _, err = run_cli("runs", "show", "nothing-like-it", *db)
    assert code == 2 and "no run 'nothing-like-it'" in err
    code, _, err = run_cli("runs", "leaderboard", "resnet", "--target", "accuracy", *db)
    assert code == 2 and "METRIC=VALUE" in err
    code, _, err = run_cli("runs", "--since", "last week", *db)
    assert code == 2 and "--since last week" in err
    code, _, err = run_cli("runs", "--db", "postgresql://someone@127.0.0.1:9/runs")
    assert code == 2 and "host 127.0.0.1 port 9" in err


def test_a_run_registers_itself_in_a_shared_index_and_says_so_when_it_cannot(
        postgres, tiny_config, monkeypatch, capsys):
    """With HPCTRAIN_DB naming PostgreSQL, the run's row is there while it trains (running,
    with a heartbeat) and holds its summary's figures at the end, without any scan. A
    database that cannot be reached costs a warning, not the run."""
    from hpctrain.train.loop import train

    monkeypatch.setenv("HPCTRAIN_DB", postgres.url)
    seen = []

    def during(parts, step):
        if step == 1:
            seen.append(Index(open_database(postgres.url)).find(str(parts.run_dir)))
    summary = train(tiny_config("train.max_steps=3", "run_name=live"), on_step=during)
    assert seen[0]["status"] == "running" and seen[0]["heartbeat"] > time.time() - 60
    row = Index(open_database(postgres.url)).find(summary["run_dir"])
    assert row["status"] == "completed" and row["steps"] == 3
    assert row["device_hours"] == pytest.approx(summary["device_hours"])
    assert row["run_id"] == seen[0]["run_id"]

    monkeypatch.setenv("HPCTRAIN_DB", "postgresql://nobody@127.0.0.1:9/runs")
    summary = train(tiny_config("train.max_steps=2", "run_name=unreachable"))
    assert summary["status"] == "completed"
    assert capsys.readouterr().err.count("cannot register this run") == 1


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


# ---- a database that is not an index, a missing folder, a read-only index -------------------

def _foreign_database(path: Path, tables: dict[str, str]) -> str:
    """Another application's SQLite file (rollback journal, rows in every table); its hash."""
    import sqlite3

    with sqlite3.connect(path) as connection:
        for name, columns in tables.items():
            connection.execute(f"CREATE TABLE {name} ({columns})")
            values = ", ".join(["7"] * (columns.count(",") + 1))
            connection.execute(f"INSERT INTO {name} VALUES ({values})")
    connection.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("tables", [
    {"runs": "id INTEGER, title TEXT", "evals": "run INTEGER, score REAL"},
    {"schema_version": "version INTEGER"},
    {"schema_version": "version INTEGER", "runs": "run_id TEXT, path TEXT, owner TEXT"},
    {"notes": "body TEXT"},
], ids=["runs-and-evals", "schema_version", "runs-with-other-columns", "any-table"])
def test_another_applications_database_is_refused_and_left_as_it_was(
        tmp_path, fleet, run_cli, private_state, tables):
    """`runs --db F` (also --no-refresh, and through report and watch) on another
    application's SQLite file dropped its runs and evals tables, rewrote a schema_version,
    switched the file to WAL and exited 0. Now: exit 2, one line, not a byte changed."""
    path = tmp_path / "app.sqlite"
    digest = _foreign_database(path, tables)
    for verb in (["runs", "--root", str(fleet)], ["runs", "--no-refresh"],
                 ["runs", "show", "a1"], ["report", "a1"], ["watch", "a1", "--once"]):
        code, _, err = run_cli(*verb, "--db", str(path))
        assert code == 2 and "is not an hpctrain runs index" in err, (verb, err)
        assert err.count("error:") == 1 and "Traceback" not in err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("app")) == \
        ["app.sqlite"]  # no -wal, -shm or -journal left beside it


def test_an_index_written_before_the_mark_is_marked_and_keeps_its_runs(tmp_path, fleet):
    import sqlite3

    from hpctrain.runs.index import APPLICATION_ID, MARK_TABLE

    where = tmp_path / "index.sqlite"
    refreshed(str(where), fleet).db.close()
    with sqlite3.connect(where) as connection:  # as the hpctrain before this one wrote it
        connection.execute(f"DROP TABLE {MARK_TABLE}")
        connection.execute("PRAGMA application_id = 0")
    connection.close()
    index = Index(open_database(str(where)))
    assert len(index.runs()) == 5 and index.db.has_table(MARK_TABLE)
    assert index.db.rows("PRAGMA application_id")[0]["application_id"] == APPLICATION_ID


def test_db_in_a_folder_that_does_not_exist_is_an_error(tmp_path, run_cli, private_state):
    code, _, err = run_cli("runs", "--db", str(tmp_path / "nowhere" / "index.sqlite"))
    assert code == 2 and f"the folder {tmp_path / 'nowhere'} does not exist" in err
    assert not (tmp_path / "nowhere").exists()
    code, _, err = run_cli("runs", "--db", str(tmp_path))
    assert code == 2 and "is a folder" in err


def test_a_read_only_index_is_read_as_it_is(tmp_path, fleet, run_cli, private_state):
    """On a read-only file system (also what a file of another user looks like): the runs it
    holds, no refresh, a note that says so."""
    folder = tmp_path / "index"
    folder.mkdir()
    refreshed(str(folder / "index.sqlite"), fleet).db.close()
    shutil.rmtree(fleet / "b2")  # a refresh would mark it missing
    read_only = tmp_path / "ro"
    read_only.mkdir()
    subprocess.run(["mount", "--bind", str(folder), str(read_only)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(read_only)], check=True)
        code, out, err = run_cli("runs", "--json", "--db", str(read_only / "index.sqlite"),
                                 "--root", str(fleet))
    finally:
        subprocess.run(["umount", "--lazy", str(read_only)], check=True)  # the CLI in this
        # process may hold the file open until its index is collected
    assert code == 0, err
    assert "is read-only: shown as it is, not refreshed" in err
    rows = json.loads(out)
    assert len(rows) == 5 and {r["status"] for r in rows if r["name"] == "b2"} != {"missing"}
