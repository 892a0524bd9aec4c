"""A study folder's files crafted or damaged (issue 69): tune.json, scale.json, the Optuna
journal, claims and a trial's run name. Each is named in one line with exit 2, a verb that only
reads writes nothing, and nothing outside the study changes. What could read without bound (a
link to /dev/zero, a huge file) runs in a child under a memory limit: tests/runs/."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpctrain.errors import ConfigError, UserError
from hpctrain.tune import space
from hpctrain.tune.journal import LINE_CAP
from hpctrain.tune.study import open_study
from hpctrain.tune.worker import take_trial
from tune_studies import prepared


@pytest.fixture
def victim(tmp_path) -> Path:
    """A folder outside every study, that no probe may change."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "precious.txt").write_text("precious\n")
    return folder


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<folder>"
            for p in sorted(folder.rglob("*"))}


def _settings(change):
    def spoil(folder: Path, victim: Path) -> None:
        path = folder / "tune.json"
        settings = json.loads(path.read_text())
        change(settings, victim)
        path.write_text(json.dumps(settings))
    return spoil


def _journal_line(text: str):
    def spoil(folder: Path, victim: Path) -> None:
        with open(folder / "study.journal", "a") as journal:
            journal.write(text + "\n")
    return spoil


def _journal_link(folder: Path, victim: Path) -> None:
    (folder / "study.journal").unlink()
    (folder / "study.journal").symlink_to(victim / "precious.txt")


def _no_journal(folder: Path, victim: Path) -> None:
    (folder / "study.journal").unlink()


# probe -> how the search's folder is spoiled, and the words that name it
PROBES = {
    "trials NaN": (_settings(lambda s, v: s.update(trials=math.nan)),
                   "tune.json is damaged: trials is NaN, not a whole number from 1 to 100,000"),
    "a budget past the bound": (_settings(lambda s, v: s.update(trials=10**12)),
                                "trials is 1000000000000, not a whole number from 1 to 100,000"),
    "trials as text": (_settings(lambda s, v: s.update(trials="many")),
                       'trials is "many", not a whole number'),
    "space not a list": (_settings(lambda s, v: s.update(space=5)),
                         "space is 5, not a list, each text"),
    "an unknown objective": (_settings(lambda s, v: s.update(objective="__class__")),
                             'objective is "__class__", not one of best_val_accuracy'),
    "a field of its own": (_settings(lambda s, v: s.update(extra=1)),
                           "'extra' is not one of its fields"),
    "a field missing": (_settings(lambda s, v: s.pop("space")), "space is missing"),
    "not an object": (lambda f, v: (f / "tune.json").write_text("[1, 2]"),
                      "tune.json is damaged: it is not a JSON object"),
    "cut short": (lambda f, v: (f / "tune.json").write_text('{"recipe": "def'),
                  "tune.json is damaged: it is not a JSON object (cut short?)"),
    "nested deep": (lambda f, v: (f / "tune.json").write_text("[" * 100_000 + "]" * 100_000),
                    "tune.json is nested deeper than 64 levels"),
    "a SQLite storage outside": (
        _settings(lambda s, v: s.update(storage=f"sqlite:///{v}/study.db")),
        "tune.json's storage 'sqlite:///"),
    "a SQLite storage inside, missing": (
        lambda f, v: _settings(lambda s, _: s.update(storage=f"sqlite:///{f}/study.db"))(f, v),
        "study.db is missing: the search's study is kept there"),
    "the journal a link": (_journal_link, "study.journal is a symbolic link, which hpctrain "
                                          "does not follow"),
    "the journal missing": (_no_journal, "study.journal is missing"),
    "a journal line not JSON": (_journal_line('{"op_code": 4, "worker'),
                                "study.journal line 2 is not JSON"),
    "a journal line too long": (_journal_line('{"op_code": 2, "worker_id": "'
                                              + "x" * LINE_CAP + '"}'),
                                "study.journal line 2 is longer than 1,048,576 bytes"),
    "a journal line nested deep": (_journal_line("[" * 100_000 + "]" * 100_000),
                                   "study.journal line 2 is nested deeper than 64 levels"),
    "a journal line of another kind": (_journal_line('{"op_code": "create", "worker_id": 1}'),
                                       'line 2 is not an Optuna operation (op_code is '
                                       '"create", not a whole number'),
    "a journal operation Optuna cannot replay": (
        _journal_line('{"op_code": 99, "worker_id": "w"}'),
        "study.journal holds an operation Optuna cannot replay (AssertionError"),
}


@pytest.mark.parametrize("probe", PROBES)
def test_a_crafted_search_folder_is_one_line_and_status_writes_nothing(probe, run_cli, tiny,
                                                                     tmp_path, victim):
    folder, _ = prepared(tiny, tmp_path)
    spoil, words = PROBES[probe]
    spoil(folder, victim)
    before, outside = contents(folder), contents(victim)
    code, out, err = run_cli("tune", "status", str(folder))
    assert code == 2 and words in err, (probe, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert contents(folder) == before and contents(victim) == outside  # status wrote nothing
    code, _, err = run_cli("tune", "--dir", str(folder), "--trials", "3")  # nor continued
    assert code == 2 and words in err, (probe, err)
    assert contents(victim) == outside


def test_a_new_search_keeps_a_sqlite_study_in_its_own_folder(run_cli, tiny, tmp_path, victim):
    """`--storage sqlite` is study.db in the search's folder; a file elsewhere is refused
    before anything is made (a crafted one made even `tune status` create a database)."""
    code, _, err = run_cli("tune", "default", *tiny(), "--space", "optim.lr=uniform(0.1,1)",
                           "--trials", "2", "--dir", str(tmp_path / "s"),
                           "--storage", f"sqlite:///{victim}/study.db")
    assert code == 2 and "not the search's own storage" in err and "--storage sqlite" in err
    assert contents(victim) == {"precious.txt": b"precious\n"}
    folder, search = prepared(tiny, tmp_path, storage="sqlite")
    assert search.storage == f"sqlite:///{folder}/study.db" and (folder / "study.db").is_file()
    code, out, err = run_cli("tune", "status", str(folder))
    assert code == 0 and "budget 2 trials" in out, err


def test_a_budget_past_the_bound_is_refused_before_it_is_written(run_cli, tiny, tmp_path):
    code, _, err = run_cli("tune", "default", *tiny(), "--space", "optim.lr=uniform(0.1,1)",
                           "--trials", str(10**6), "--dir", str(tmp_path / "s"))
    assert code == 2 and "trials is 1000000, not a whole number from 1 to 100,000" in err
    assert not (tmp_path / "s" / "tune.json").exists()


def test_a_journal_naming_a_trial_s_run_outside_the_search_is_refused(tiny, tmp_path, victim):
    """A trial's run directory comes from the journal (a retry continues its trial's); one
    naming a path would take the trial's log and run out of the search."""
    folder, search = prepared(tiny, tmp_path)
    study = open_study(folder, search)
    study.enqueue_trial({"optim.lr": 0.1}, user_attrs={"run_name": f"../../{victim.name}"})
    with pytest.raises(ConfigError, match=r"names '\.\./\.\./victim' as trial 0's run "
                                          "directory, not a plain folder name"):
        take_trial(study, search, folder, "0", space.parse_all(search.space))
    assert contents(victim) == {"precious.txt": b"precious\n"}


def test_claims_that_are_links_or_damaged_are_not_followed(tiny, tmp_path, victim):
    """A claims/ folder that is a link is refused; a claim that is a link, damaged or naming
    another place is no claim (the slot takes a new trial)."""
    folder, search = prepared(tiny, tmp_path)
    study = open_study(folder, search)
    parameters = space.parse_all(search.space)
    (folder / "claims").symlink_to(victim)
    with pytest.raises(UserError, match="claims is a symbolic link"):
        take_trial(study, search, folder, "0", parameters)
    (folder / "claims").unlink()
    (folder / "claims").mkdir()
    (folder / "claims" / "0.json").write_text(json.dumps({"trial": 0, "run_name": "../x"}))
    (folder / "claims" / "1.json").symlink_to(victim / "precious.txt")
    first = take_trial(study, search, folder, "0", parameters)
    second = take_trial(study, search, folder, "1", parameters)
    assert (first.run_name, first.resumed, second.run_name) == ("trial-0000", False,
                                                                "trial-0001")
    assert contents(victim) == {"precious.txt": b"precious\n"}


def test_a_journal_is_read_as_optuna_reads_it_and_appended_without_a_link(tiny, tmp_path,
                                                                          victim):
    """hpctrain's backend replays what Optuna's wrote, leaves a line being written for the next
    read, and never appends through a link planted after the study was opened."""
    folder, search = prepared(tiny, tmp_path)
    study = open_study(folder, search)
    trial = study.ask()
    study.tell(trial, 0.5)
    with open(folder / "study.journal", "a") as journal:
        journal.write('{"op_code": 4, "worker')  # a writer mid-line
    again = open_study(folder, search, create=False)
    assert [t.value for t in again.get_trials()] == [0.5]
    journal = folder / "study.journal"
    kept = journal.read_bytes()
    journal.unlink()
    journal.symlink_to(victim / "precious.txt")
    with pytest.raises(UserError, match="study.journal is a symbolic link"):
        study.ask()
    assert contents(victim) == {"precious.txt": b"precious\n"}
    journal.unlink()
    journal.write_bytes(kept)
    assert [t.value for t in open_study(folder, search, create=False).get_trials()] == [0.5]


def _scaled(change):
    def spoil(folder: Path) -> None:
        path = folder / "scale.json"
        settings = json.loads(path.read_text())
        change(settings)
        path.write_text(json.dumps(settings))
    return spoil


SCALE_PROBES = {
    "sizes that do not increase": (_scaled(lambda s: s.update(sizes=[2, 1])),
                                   "its sizes [2, 1] do not increase"),
    "a size of no devices": (_scaled(lambda s: s.update(sizes=[0, 1])),
                             "sizes is [0, 1], not a list of 1 to 64 device counts"),
    "a threshold NaN": (_scaled(lambda s: s.update(threshold=math.nan)),
                        "threshold is NaN, not a number above 0, at most 1"),
    "steps as text": (_scaled(lambda s: s.update(steps="many")),
                      'steps is "many", not a whole number from 10'),
    "a link": (lambda f: ((f / "scale.json").unlink(), (f / "scale.json").symlink_to(
        f.parent / "victim" / "precious.txt")), "scale.json is a symbolic link"),
}


@pytest.mark.parametrize("probe", SCALE_PROBES)
def test_a_crafted_scaling_study_is_one_line(probe, run_cli, tiny, tmp_path, victim):
    from hpctrain.tune import scale

    folder, _ = scale.prepare("default", tiny(), [1, 2], 10, False, 0.8,
                              str(tmp_path / "study"))
    spoil, words = SCALE_PROBES[probe]
    spoil(folder)
    code, _, err = run_cli("scale", "status", str(folder))
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (probe, err)
    assert contents(victim) == {"precious.txt": b"precious\n"}


@pytest.mark.parametrize("throughput, words", [
    (math.nan, "samples_per_second is NaN, not a finite number >= 0 or null"),
    ("fast", 'samples_per_second is "fast", not a finite number >= 0 or null'),
    (-5.0, "samples_per_second is -5.0, not a finite number >= 0 or null")])
def test_a_size_whose_summary_holds_an_impossible_throughput_is_named_and_left_out(
        throughput, words, run_cli, tiny, tmp_path):
    from hpctrain.tune import scale

    folder, _ = scale.prepare("default", tiny(), [1, 2], 10, False, 0.8,
                              str(tmp_path / "study"))
    for size, rate in ((1, 100.0), (2, throughput)):
        (folder / f"gpus-{size}").mkdir()
        (folder / f"gpus-{size}" / "summary.json").write_text(json.dumps({
            "status": "completed", "steps": 10, "epochs": 1.0, "samples_per_second": rate,
            "global_batch_size": 16 * size, "device": "cpu", "data_wait_fraction": 0.0}))
    code, out, err = run_cli("scale", "status", str(folder))
    assert code == 0 and "Traceback" not in err, err
    assert f"size 2: its summary.json is damaged: {words}; left out" in out, out
    assert out.splitlines()[2].split()[:2] == ["1", "100.0"]  # the size that can be read
    assert "no result for" not in out  # it has one: damaged


def test_a_trial_s_run_directory_that_is_a_link_is_refused_before_it_starts(tiny, tmp_path,
                                                                            victim):
    """A trial's run directory is a name hpctrain gives inside the search: a link there would
    take the trial's checkpoints and metrics into any folder of the user's."""
    from hpctrain.tune.worker import Launch, Worker

    folder, _ = prepared(tiny, tmp_path)
    (folder / "trial-0000").symlink_to(victim)
    with pytest.raises(UserError, match="trial-0000 is a symbolic link"):
        Worker(folder, "0", Launch(), say=lambda _: None).run()
    assert contents(victim) == {"precious.txt": b"precious\n"}
    assert not (folder / "logs").exists()  # refused before its log was made
