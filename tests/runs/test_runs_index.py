"""The runs index on real SQLite and a real PostgreSQL server: the tests that train, in this
process or in an `hpctrain` process of their own (the others are
tests/unit/test_runs_index.py, tests/cluster/test_runs_index.py)."""

import json
import multiprocessing
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain.runs.database import open_database
from hpctrain.runs.index import Index
from hpctrain.runs.scan import scan_run
from run_fleet import refreshed


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
