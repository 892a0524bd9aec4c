"""`hpctrain tune`: the tests that need no training run, no process and no server (the others
are tests/runs/test_tune.py, tests/cluster/test_tune.py)."""

import re
import os
import time

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from hpctrain.errors import ConfigError
from hpctrain.tune import space
from hpctrain.tune.study import check_storage, open_study
from hpctrain.tune.worker import (STALE_SECONDS, budget_used, claim_file, fail_stale,
                                  take_trial)
from tune_studies import LR, prepared


def test_space_specs_read_into_distributions():
    lr = space.parse("optim.lr=loguniform(1e-3, 1)")
    assert (lr.kind, lr.low, lr.high) == ("loguniform", 1e-3, 1.0)
    assert lr.distribution().log and lr.grid() is None
    assert space.parse("train.batch_size=int(8,32,8)").grid() == [8, 16, 24, 32]
    assert space.parse("train.label_smoothing=uniform(0,0.2,0.1)").grid() == [0.0, 0.1, 0.2]
    choice = space.parse("optim.name=choice(sgd,lamb)")
    assert choice.choices == ("sgd", "lamb") and choice.grid() == ["sgd", "lamb"]
    assert space.parse("model.kwargs.x=choice(0.5,true,none)").choices == (0.5, True, "none")
    assert space.override("optim.nesterov", True) == "optim.nesterov=true"


@pytest.mark.parametrize("spec, message", [
    ("optim.lr=loguniform(0,1)", "optim.lr: loguniform needs 0 < LOW"),
    ("optim.lr=uniform(1,0.5)", "optim.lr: LOW must be below HIGH"),
    ("optim.lr=gauss(0,1)", "optim.lr: unknown kind 'gauss'"),
    ("optim.lr=uniform(a,b)", "optim.lr: uniform takes numbers"),
    ("train.batch_size=int(1.5,8)", "train.batch_size: int takes whole numbers"),
    ("optim.name=choice(sgd)", "optim.name: choice needs two or more values"),
    ("train.label_smoothing=uniform(0,0.25,0.1)", "not a whole number of steps"),
    ("optim.lr", "write KEY=KIND(ARGS)"),
])
def test_a_bad_space_spec_names_the_parameter(spec, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        space.parse(spec)


def test_bad_searches_are_exit_2_naming_the_culprit(run_cli, tiny, tmp_path):
    def tune(*args):
        return run_cli("tune", "default", *tiny(), "--trials", "2", *args)

    code, _, err = run_cli("tune", "default", *tiny(), "--space", LR)
    assert code == 2 and "--trials N: how many trials" in err
    code, _, err = tune()
    assert code == 2 and "give the search space: --space" in err
    code, _, err = tune("--space", LR, "--dry-run")
    assert code == 2 and "add --submit" in err
    code, _, err = tune("--space", "optim.lrr=loguniform(0.01,1)")
    assert code == 2 and "--space optim.lrr" in err and "did you mean 'optim.lr'" in err
    code, _, err = tune("--space", "optim.name=choice(sgd,adagrad)")
    assert code == 2 and "--space optim.name" in err and "adagrad" in err
    code, _, err = tune("--space", LR, "--space", "optim.lr=uniform(0.1,1)")
    assert code == 2 and "optim.lr: given twice" in err
    code, _, err = tune("--space", LR, "--objective", "accuracy:max")
    assert code == 2 and "'accuracy' is not a figure of summary.json" in err
    code, _, err = tune("--space", LR, "--objective", "best_val_loss")
    assert code == 2 and "end with :max or :min" in err
    code, _, err = tune("--space", LR, "--sampler", "grid")
    assert code == 2 and "optim.lr is a continuous range" in err
    code, _, err = tune("--space", LR, "run_name=mine")
    assert code == 2 and "hpctrain tune sets run_name" in err
    code, _, err = tune("--space", LR, "--storage", "mongodb://x")
    assert code == 2 and "give a PostgreSQL URL" in err
    code, _, err = tune("--space", LR, "--submit", "--storage", f"sqlite:///{tmp_path}/s.db")
    assert code == 2 and "SQLite" in err
    assert not list((tmp_path / "runs").glob("*tune*"))  # nothing was started


def test_sqlite_is_refused_on_a_shared_file_system_and_outside_the_search(monkeypatch,
                                                                           tmp_path):
    monkeypatch.setattr("hpctrain.tune.study.file_system_type", lambda path: "lustre")
    with pytest.raises(ConfigError, match=r"shared file system \(lustre\)"):
        check_storage(f"sqlite:///{tmp_path}/study.db", array=False, folder=tmp_path)
    monkeypatch.setattr("hpctrain.tune.study.file_system_type", lambda path: "ext4")
    assert check_storage(f"sqlite:///{tmp_path}/study.db", array=False,
                         folder=tmp_path) == f"sqlite:///{tmp_path}/study.db"
    assert check_storage("sqlite", array=False, folder=tmp_path) == \
        f"sqlite:///{tmp_path}/study.db"  # the search's own, in its folder
    with pytest.raises(ConfigError, match="not the search's own storage"):
        check_storage(f"sqlite:///{tmp_path}/elsewhere/study.db", array=False,
                      folder=tmp_path / "search")
    assert check_storage("postgresql://u@h/db", array=True, folder=tmp_path) == \
        "postgresql+psycopg://u@h/db"


def test_a_trial_left_by_a_lost_worker_is_failed_and_retried_in_its_run_directory(tiny,
                                                                                  tmp_path):
    folder, search = prepared(tiny, tmp_path)
    study = open_study(folder, search)
    parameters = space.parse_all(search.space)
    first = take_trial(study, search, folder, "0", parameters)
    again = take_trial(study, search, folder, "0", parameters)  # its slot's next job
    assert (again.trial, again.run_name, again.resumed) == (first.trial, "trial-0000", True)
    assert fail_stale(study, folder) == []  # its heartbeat is fresh
    old = time.time() - STALE_SECONDS - 60
    os.utime(claim_file(folder, "0"), (old, old))  # the worker died an age ago
    retry = take_trial(study, search, folder, "1", parameters)
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL
    assert (retry.trial, retry.run_name, retry.resumed) == (1, "trial-0000", True)
    assert retry.params == first.params and trials[1].user_attrs["retry_of"] == 0
    assert budget_used(trials) == 1  # the retry takes the lost trial's place
    third = take_trial(study, search, folder, "2", parameters)
    assert (third.trial, third.run_name, third.resumed) == (2, "trial-0002", False)
    assert take_trial(study, search, folder, "3", parameters) is None  # budget of 2 spent
    assert not claim_file(folder, "3").exists()
    # the lost slot comes back: its trial has been retried elsewhere; nothing is left
    assert take_trial(study, search, folder, "0", parameters) is None


def test_scale_refuses_what_cannot_run(run_cli, tiny):
    code, _, err = run_cli("scale", "default", *tiny(), "--gpus", "2,1")
    assert code == 2 and "give increasing sizes" in err
    code, _, err = run_cli("scale", "default", *tiny(), "--gpus", "1,3", "--strong")
    assert code == 2 and "the global batch 16 does not split over 3 devices" in err
    code, _, err = run_cli("scale", "default", *tiny(), "--gpus", "1,2", "--threshold", "2")
    assert code == 2 and "--threshold 2.0" in err
    code, _, err = run_cli("scale", "status", "/nonexistent")
    assert code == 2 and "not a scaling study" in err


def test_the_array_script_runs_a_worker_per_element_that_continues_itself(run_cli, tiny,
                                                                          tmp_path, home):
    code, out, err = run_cli("tune", "default", *tiny(), "--space", LR, "--trials", "9",
                             "--parallel", "3", "--submit", "--gpus", "2", "--time", "30",
                             "--dir", str(tmp_path / "search"), "--dry-run")
    assert code == 0, err
    assert "#SBATCH --array=0-2" in out and "#SBATCH --ntasks-per-node=2" in out
    assert f'-m hpctrain tune worker {tmp_path / "search"} --slot "$SLURM_ARRAY_TASK_ID" &' \
        in out
    assert "srun" not in out.split("run=$!")[0].splitlines()[-1]  # the worker sruns trials
    assert '--array="$element"' in out  # a stopped element continues as itself
    assert f"#SBATCH --output={tmp_path / 'search'}/slurm-%A_%a.out" in out
    code, _, err = run_cli("tune", "default", *tiny(), "--space", LR, "--trials", "2",
                           "--submit", "--container", str(tmp_path / "x.sif"),
                           "--dir", str(tmp_path / "other"), "--dry-run")
    assert code == 2 and "--container with tune --submit" in err


def test_samplers_and_pruners_follow_the_settings():
    from hpctrain.tune.study import Search, pruner, sampler

    search = Search(recipe=None, overrides=[], space=[LR], objective="best_val_accuracy",
                    direction="maximize", trials=8)
    assert search.metric == "val_accuracy"
    assert type(pruner(search)).__name__ == "MedianPruner"
    search.pruner = "hyperband"
    assert type(pruner(search)).__name__ == "HyperbandPruner"
    search.objective = "samples_per_second"  # known only at the end: nothing to prune on
    assert search.metric is None and type(pruner(search)).__name__ == "NopPruner"
    parameters = space.parse_all([LR])
    for name, kind in (("tpe", "TPESampler"), ("random", "RandomSampler"),
                       ("cmaes", "CmaEsSampler")):
        search.sampler = name
        assert type(sampler(search, 0, parameters)).__name__ == kind
    search.sampler = "tpe"
    first = [sampler(search, slot, parameters) for slot in (0, 1)]
    study = optuna.create_study()
    proposals = [s.sample_independent(study, create_trial(value=0.0), "x",
                                      parameters[0].distribution()) for s in first]
    assert proposals[0] != proposals[1]  # two workers do not start with the same trial


def test_a_study_or_search_that_cannot_be_opened_is_exit_2(run_cli, tiny, tmp_path):
    code, _, err = run_cli("tune", "default", *tiny(), "--space", LR, "--trials", "2",
                           "--storage", "postgresql://someone@127.0.0.1:9/study",
                           "--dir", str(tmp_path / "search"))
    assert code == 2 and "cannot open the study's database" in err
    assert len(err.strip().splitlines()) == 1 and "password" not in err
    code, _, err = run_cli("tune", "status", str(tmp_path))
    assert code == 2 and "not a search folder (no tune.json)" in err
