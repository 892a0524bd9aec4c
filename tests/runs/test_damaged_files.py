"""Files of a run that hpctrain reads back, damaged: each is named by its one validating reader,
and `runs`, `report` and `watch` mark that run and go on (issue 37, item 4)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from launching import limited

FIRST = 1795600000.0  # when the fleet's runs started
INF = float("inf")


def write_run(run: Path, number: int) -> None:
    """A finished run's files, as hpctrain writes them (no checkpoints: nothing reads them)."""
    run.mkdir(parents=True)
    started = FIRST + number * 60
    (run / "config.yaml").write_text("name: fleet\ntrain:\n  max_steps: 4\n")
    (run / "run.json").write_text(json.dumps({
        "run_id": f"id-{number:04d}", "name": run.name, "recipe": "fleet", "created": started,
        "user": "ada", "cluster": None, "git_commit": None, "config_hash": "f" * 16,
        "starts": [{"time": started, "job_id": None, "restart": 0, "launcher": "single",
                    "world_size": 1, "hosts": ["n1"], "gpu_model": None, "gpus": 0,
                    "output_dir": str(run.parent), "seconds": 30.0, "device_hours": 0.01,
                    "energy_joules": None}]}))
    records = [{"kind": "train", "step": step, "time": started + step, "loss": 2.0 / step,
                "samples_per_second": 100.0} for step in (2, 4)]
    records.append({"kind": "eval", "step": 4, "time": started + 5, "val_accuracy": 0.5,
                    "elapsed_seconds": 5.0, "device_hours": 0.01, "energy_joules": None})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps({
        "status": "completed", "steps": 4, "best_val_accuracy": 0.5, "device": "cpu",
        "world_size": 1, "device_hours": 0.01, "wall_seconds": 30.0}))


def _edit(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def _append(run: Path, record: dict) -> None:
    with open(run / "metrics.jsonl", "a") as metrics:
        metrics.write(json.dumps({"time": FIRST, **record}) + "\n")


# name -> (how a run's file is damaged, the words naming it, read by `runs` too)
DAMAGE = {
    "created": (lambda r: _edit(r / "run.json", lambda j: j.update(created=1e300)),
                "run.json: created is 1e+300", True),
    "starts": (lambda r: _edit(r / "run.json", lambda j: j.update(starts=5)),
               "run.json: starts is 5", True),
    "hosts": (lambda r: _edit(r / "run.json", lambda j: j["starts"][0].update(hosts={})),
              "run.json: starts[0].hosts is {}", True),
    "recipe": (lambda r: _edit(r / "run.json", lambda j: j.update(recipe={})),
               "run.json: recipe is {}", True),
    "a job's seconds past a year": (  # before: 100 % training and 100 % start-up at once
        lambda r: _edit(r / "run.json", lambda j: j["starts"][0].update(seconds=1e308)),
        "run.json: starts[0].seconds is 1e+308, not a number of seconds from 0 to a year",
        True),
    "a phase's seconds negative": (
        lambda r: _edit(r / "run.json", lambda j: j["starts"][0].update(
            split={"training": -5.0})), "run.json: starts[0].split is", True),
    "a throughput NaN": (
        lambda r: _edit(r / "summary.json", lambda j: j.update(samples_per_second=math.nan)),
        "summary.json is damaged: samples_per_second is NaN", True),
    "restarts negative": (lambda r: _edit(r / "summary.json", lambda j: j.update(restarts=-1)),
                          "summary.json is damaged: restarts is -1", True),
    "a share over 100 %": (
        lambda r: _edit(r / "summary.json", lambda j: j.update(data_wait_fraction=1.7)),
        "summary.json is damaged: data_wait_fraction is 1.7, not a fraction from 0 to 1",
        True),
    "eval step": (lambda r: _append(r, {"kind": "eval", "step": 10**23, "val_accuracy": 0.9}),
                  "metrics.jsonl line 4: step is 100000000000000000000000", True),
    "eval step float": (lambda r: _append(r, {"kind": "eval", "step": 1e23}),
                        "metrics.jsonl line 4: step is 1e+23", True),
    "step infinite": (lambda r: _append(r, {"kind": "train", "step": INF, "loss": 1.0}),
                      "metrics.jsonl line 4: step is Infinity", True),
    "memory infinite": (lambda r: _append(r, {"kind": "gpu", "step": 4,
                                              "memory_used_bytes": [INF]}),
                        "metrics.jsonl line 4: memory_used_bytes is [Infinity]", True),
    "profile bound": (lambda r: (r / "profile").mkdir() or (r / "profile" / "profile.json")
                      .write_text(json.dumps({"verdict": {"bound": 7, "reason": "?"}})),
                      "profile.json: verdict.bound is 7", False),
    "memory size": (lambda r: (r / "fleet-memory.json").write_text(json.dumps({"estimate": {
        "device": "cuda", "batch_size": 8, "precision": "bf16", "peak_allocated_bytes": "big",
        "in_use_bytes": 1}})), 'fleet-memory.json: estimate.peak_allocated_bytes is "big"',
        False),
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> tuple[Path, dict[str, tuple[str, bool]]]:
    """1,000 runs, one in ten damaged (each kind of DAMAGE ten times): the folder, and each
    damaged run's name -> (the words naming its damage, whether `runs` reads that file)."""
    root = tmp_path_factory.mktemp("fleet") / "runs"
    damaged = {}
    kinds = list(DAMAGE.items())
    for number in range(1000):
        run = root / f"fleet-{number:04d}"
        write_run(run, number)
        if number % 10 == 3:
            name, (spoil, words, listed) = kinds[(number // 10) % len(kinds)]
            spoil(run)
            damaged[run.name] = (words, listed)
    return root, damaged


def test_runs_lists_a_fleet_with_damaged_runs_naming_each(fleet, run_cli, tmp_path,
                                                          monkeypatch):
    root, damaged = fleet
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    db = tmp_path / "runs.sqlite"
    code, out, err = run_cli("runs", "--root", str(root), "--db", str(db), "--json",
                             "--limit", "5000")
    assert code == 0 and "Traceback" not in err
    rows = {row["name"]: row for row in json.loads(out)}
    assert len(rows) == 1000
    for name, (words, listed) in damaged.items():
        if listed:
            assert rows[name]["status"] == "damaged" and words in rows[name]["problem"], name
        else:  # `runs` does not read profile.json or a memory prediction
            assert rows[name]["status"] == "completed"
    assert sum(row["status"] == "completed" for row in rows.values()) == \
        900 + sum(not listed for _, listed in damaged.values())
    code, out, _ = run_cli("runs", "--db", str(db), "usage", "--by", "recipe")  # remembered
    assert code == 0 and "fleet" in out


def test_report_of_a_fleet_with_damaged_runs_names_each_and_writes_the_page(fleet, run_cli,
                                                                            tmp_path):
    root, damaged = fleet
    runs = sorted(str(run) for run in root.iterdir())
    code, out, err = run_cli("report", *runs, "--out", str(tmp_path / "fleet.html"))
    assert code == 0 and "Traceback" not in err, err[-2000:]
    page = (tmp_path / "fleet.html").read_text()
    for name, (words, _) in damaged.items():
        assert f"{root / name}: {words}" in err, name
        assert words.replace('"', "&quot;") in page


def test_watch_names_the_damage_and_goes_on(fleet, run_cli):
    root, damaged = fleet
    for name, (words, listed) in damaged.items():
        if not listed:
            continue
        code, out, err = run_cli("watch", str(root / name), "--once")
        assert code == 0 and "Traceback" not in err, name
        assert "damaged: " in out and words.split(": ")[-1] in out, name


def test_the_end_of_run_report_never_fails_the_run(tmp_path, monkeypatch):
    from hpctrain.report import chart
    from hpctrain.report.page import write_run_report

    run = tmp_path / "finished"
    write_run(run, 0)
    assert write_run_report(run) is None and (run / "report.html").is_file()

    def broken(*_):
        raise RuntimeError("a charting bug")
    monkeypatch.setattr(chart, "png", broken)
    said = write_run_report(run)  # returned for the run to print, never raised
    assert "RuntimeError: a charting bug" in said and f"hpctrain report {run}" in said


# ---- bombs (issue 51, item 3): every read is bounded, every damage named --------------------

def _link_to_zero(name: str):
    def spoil(run: Path) -> None:
        (run / name).unlink()
        (run / name).symlink_to("/dev/zero")
    return spoil


def _nested(name: str, depth: int = 30000):
    def spoil(run: Path) -> None:
        with open(run / name, "a" if name == "metrics.jsonl" else "w") as file:
            file.write("[" * depth + "]" * depth + "\n")
    return spoil


def _sparse(name: str, size: int = 100 << 30):
    def spoil(run: Path) -> None:
        with open(run / name, "r+b") as file:
            file.truncate(size)
    return spoil


# name -> (how, the words naming it in `runs`, `report` and `watch`)
BOMBS = {
    "summary.json to /dev/zero": (_link_to_zero("summary.json"),
                                  "summary.json is a symbolic link"),
    "run.json to /dev/zero": (_link_to_zero("run.json"), "run.json is a symbolic link"),
    "metrics.jsonl to /dev/zero": (_link_to_zero("metrics.jsonl"),
                                   "metrics.jsonl is a symbolic link"),
    "summary.json nested 30,000 deep": (_nested("summary.json"),
                                        "summary.json is nested deeper than 64 levels"),
    "run.json nested 30,000 deep": (_nested("run.json"),
                                    "run.json is nested deeper than 64 levels"),
    "metrics.jsonl line nested 30,000 deep": (_nested("metrics.jsonl"),
                                              "is nested deeper than 64 levels"),
    "summary.json of 100 GB": (_sparse("summary.json"),
                               "summary.json holds 107,374,182,400 bytes, more than"),
}


def _limited(*args: str, home: Path) -> tuple[int, str, str]:
    """`hpctrain ARGS` in a child of 4 GiB of address space, with its own state folder."""
    return limited(*args, env={"XDG_STATE_HOME": str(home)})


def test_links_to_dev_zero_deep_nesting_and_huge_files_are_named_not_read(tmp_path):
    root = tmp_path / "runs"
    for number, (name, (spoil, _)) in enumerate(BOMBS.items()):
        write_run(root / f"bomb-{number}", number)
        spoil(root / f"bomb-{number}")
    write_run(root / "whole", 99)
    code, out, err = _limited("runs", "--root", str(root), "--db", str(tmp_path / "i.sqlite"),
                              "--json", home=tmp_path / "state")
    assert code == 0 and "Traceback" not in err, err[-3000:]
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["whole"]["status"] == "completed"
    for number, (name, (_, words)) in enumerate(BOMBS.items()):
        assert rows[f"bomb-{number}"]["status"] == "damaged", name
        assert words in rows[f"bomb-{number}"]["problem"], (name, rows[f"bomb-{number}"])
    runs = [str(root / f"bomb-{number}") for number in range(len(BOMBS))]
    code, out, err = _limited("report", *runs, "--out", str(tmp_path / "r.html"),
                              home=tmp_path / "state")
    assert code == 0 and "Traceback" not in err, err[-3000:]
    for number, (name, (_, words)) in enumerate(BOMBS.items()):
        assert words in err, name
    for number, (name, (_, words)) in enumerate(BOMBS.items()):
        code, out, err = _limited("watch", runs[number], "--once", home=tmp_path / "state")
        assert code == 0 and "Traceback" not in err, (name, err[-3000:])
        assert "damaged: " in out and words in out, (name, out)


def test_a_lock_that_is_a_link_or_nested_deep_is_named_by_run(tmp_path, tiny):
    """`run` in a named run directory whose run.lock links to /dev/zero, or holds JSON nested
    30,000 deep: refused in one line naming why, within the memory limit."""
    run = tmp_path / "runs" / "held"
    write_run(run, 0)
    (run / "run.lock").symlink_to("/dev/zero")
    code, _, err = _limited("run", "default", *tiny("run_name=held", "resume=auto"),
                            home=tmp_path / "state")
    assert code == 2 and "Traceback" not in err and "run.lock is a symbolic link" in err, err
    (run / "run.lock").unlink()
    (run / "run.lock").write_text("[" * 30000 + "]" * 30000)
    code, _, err = _limited("run", "default", *tiny("run_name=held", "resume=auto"),
                            home=tmp_path / "state")
    assert code == 2 and "Traceback" not in err, err
    assert "in use by a run whose lock cannot be read (it is nested deeper than 64 levels)" \
        in err
