"""The runs index on real SQLite and a real PostgreSQL server: a hand-computed set of run
directories gives the same usage and leaderboard on both; refreshes are incremental; damaged,
half-written, moved and silent runs are listed as what they are.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_runs_index.py, tests/cluster/test_runs_index.py."""

import hashlib
import json
import re
from pathlib import Path

import pytest

from hpctrain.runs.database import open_database
from hpctrain.runs.index import Index
from run_fleet import refreshed


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


@pytest.mark.parametrize("url, why", [
    ("postgresql://me:secret@[::1/runs", "Invalid IPv6 URL"),
    ("postgresql://me:secret@host:99999/runs", "Port out of range"),
    ("postgresql://me:secret@host:port/runs", "Port could not be cast")])
def test_a_postgresql_url_that_cannot_be_read_is_one_line_without_its_password(
        run_cli, private_state, url, why):
    """Issue 69: a malformed IPv6 host was a ValueError traceback, exit 70."""
    code, out, err = run_cli("runs", "--db", url)
    assert code == 2 and why in err and "postgresql://USER@HOST:PORT/DATABASE" in err
    assert "secret" not in out + err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
