"""`hpctrain tune`: the search space, a local search with pruning whose trials are normal run
directories, a crashed trial, a DDP trial pruned on both ranks, stale trials retried in their
own run directory, and the search as a Slurm array job (with a trial preempted by SIGUSR1
that resumes as the same trial)."""

import json
import re
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from hpctrain.config import load_config
from hpctrain.tasks.registry import TASK_OBJECTIVE, TASK_OF_DATA
from hpctrain.errors import ConfigError
from hpctrain.runs.directory import RunDir
from hpctrain.runs.identity import read_identity
from hpctrain.tune import space
from hpctrain.tune.search import Options, prepare
from hpctrain.tune.study import OBJECTIVES, check_storage, open_study, read_search
from hpctrain.tune.worker import (STALE_SECONDS, budget_used, claim_file, fail_stale,
                                  take_trial)

LR = "optim.lr=loguniform(1e-5,1)"
STRIPES = f"{Path(__file__).parent / 'fixtures' / 'stripes.py'}:stripes"


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


def test_sqlite_is_refused_on_a_shared_file_system(monkeypatch, tmp_path):
    monkeypatch.setattr("hpctrain.tune.study.file_system_type", lambda path: "lustre")
    with pytest.raises(ConfigError, match=r"shared file system \(lustre\)"):
        check_storage(f"sqlite:///{tmp_path}/study.db", array=False)
    monkeypatch.setattr("hpctrain.tune.study.file_system_type", lambda path: "ext4")
    assert check_storage(f"sqlite:///{tmp_path}/study.db", array=False).startswith("sqlite")
    assert check_storage("postgresql://u@h/db", array=True) == "postgresql+psycopg://u@h/db"


def test_every_objective_is_a_number_of_a_runs_summary(tiny_config, tmp_path):
    from hpctrain.train.loop import train

    summary = train(tiny_config("train.max_steps=2"))
    language_only = {"best_val_loss", "best_val_perplexity", "tokens_per_second", "mfu"}
    tensors_only = {"final_val_mse", "final_val_mae", "final_val_r2", "final_val_f1",
                    "final_val_precision", "final_val_recall", "final_val_exact_match",
                    "final_val_miou"}  # test_tensors.py reads them from those runs
    assert set(OBJECTIVES) - set(summary) == language_only | tensors_only
    assert all(summary[k] is None or isinstance(summary[k], float)
               for k in set(OBJECTIVES) - language_only - tensors_only)


@pytest.fixture(scope="session")
def local_search(tmp_path_factory):
    """One local search for the session: 6 trials, 2 at a time, median pruning, on data a
    tiny CNN learns in 30 steps (3 epochs: the trials' reduction, --reduce) at a good
    learning rate and not at all at 1e-5, so that the pruner has trials to stop."""
    from conftest import run_installed

    out = tmp_path_factory.mktemp("tune")
    folder = out / "search"
    result = run_installed(
        "tune", "default", f"output_dir={out}", f"data.dataset={STRIPES}",
        "data.image_size=8", "data.num_workers=0", "model.name=hpctrain:tiny_cnn",
        "train.batch_size=32", "train.eval_every_epochs=0.5", "train.log_every=5",
        "tensorboard=false", "report=false", "--reduce", "train.epochs=3", "--space", LR,
        "--trials", "6", "--parallel", "2", "--seed", "1", "--dir", str(folder), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, json.loads(result.stdout), result.stderr


def test_a_local_search_runs_each_trial_once_in_its_own_run_directory(local_search):
    folder, result, _ = local_search
    rows = result["trials"]
    assert [r["trial"] for r in rows] == list(range(6))
    assert result["budget"] == 6 and sum(result["states"].values()) == 6
    assert set(result["states"]) <= {"complete", "pruned"}
    for row in rows:
        run = RunDir(Path(row["run_dir"]))
        config = load_config(run.config)
        assert config.trial.number == row["trial"] and config.trial.study_dir == str(folder)
        assert config.optim.lr == pytest.approx(row["params"]["optim.lr"])
        assert run.read_summary()["status"] == {"complete": "completed",
                                                "pruned": "pruned"}[row["state"]]
        assert len(read_identity(run.path)[0]["starts"]) == 1
    completed = [r for r in rows if r["state"] == "complete"]
    best = max(completed, key=lambda r: r["value"])
    assert result["best"]["trial"] == best["trial"]
    assert best["value"] == RunDir(Path(best["run_dir"])).read_summary()["best_val_accuracy"]


def test_pruning_stops_poor_trials_early(local_search):
    """Fewer steps in all than the same trials without pruning, each of which would have
    trained every step (30 a trial); a pruned trial keeps its run directory."""
    folder, result, log = local_search
    pruned = [r for r in result["trials"] if r["state"] == "pruned"]
    assert pruned, log[-3000:]
    full = load_config(RunDir(folder / "trial-0000").config)
    steps_per_trial = 30  # 320 samples / batch 32 x 3 epochs
    assert all(r["steps"] < steps_per_trial for r in pruned)
    assert result["steps_trained"] < steps_per_trial * len(result["trials"])
    for row in pruned:
        records, *_ = RunDir(Path(row["run_dir"])).read_metrics()
        assert any(r["kind"] == "eval" for r in records)
        assert row["evaluations"] >= 1 and full.train.epochs == 3


def test_the_best_configuration_is_written_as_a_recipe_with_pictures(local_search, run_cli):
    folder, result, _ = local_search
    best = load_config(folder / "best.yaml")
    assert best.optim.lr == result["best"]["params"]["optim.lr"]
    assert best.trial.study_dir is None and best.run_name is None
    assert best.name == "default-tuned" and best.model.name == "hpctrain:tiny_cnn"
    header = (folder / "best.yaml").read_text().splitlines()[:4]
    assert "trial" in header[0]
    assert header[2] == "# its trials also ran with train.epochs=3 (--reduce, to make each " \
                        "cheaper): left out here"
    assert best.train.epochs == load_config("default").train.epochs != 3  # the recipe's
    assert result["importances"] == {"optim.lr": pytest.approx(1.0)}
    for picture in ("history.png", "parallel.png"):
        assert (folder / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, _ = run_cli("tune", "status", str(folder))
    assert code == 0 and f"best: trial {result['best']['trial']}" in out
    assert "<- best" in out and "importance: optim.lr 1.00" in out


def test_a_finished_search_continued_with_the_same_budget_runs_nothing(local_search, run_cli):
    folder, result, _ = local_search
    search = read_search(folder)
    reduce = [f"--reduce={text}" for text in search.reductions]
    code, out, err = run_cli("tune", search.recipe, *search.overrides, *reduce, "--space", LR,
                             "--trials", "6", "--seed", "1", "--dir", str(folder), "--json")
    assert code == 0, err
    assert json.loads(out)["states"] == result["states"]
    code, _, err = run_cli("tune", search.recipe, *search.overrides, *reduce, "--space", LR,
                           "--trials", "6", "--seed", "2", "--dir", str(folder))
    assert code == 2 and "another seed" in err
    code, _, err = run_cli("tune", search.recipe, *search.overrides, "--space", LR,
                           "--trials", "6", "--seed", "1", "--dir", str(folder))
    assert code == 2 and "another reductions" in err


def _prepared(tiny, tmp_path, *extra, space_specs=(LR,), trials=2, **options):
    folder, search = prepare("default", tiny(*extra), Options(
        space=list(space_specs), trials=trials, folder=str(tmp_path / "search"), **options))
    return folder, search


def test_a_crashed_trial_is_marked_failed_and_the_search_goes_on(run_cli, tiny, tmp_path):
    code, out, err = run_cli("tune", "default", *tiny("train.max_steps=2"), "--space",
                             "model.name=choice(hpctrain:tiny_cnn,hpctrain:no_such_model)",
                             "--sampler", "grid", "--dir", str(tmp_path / "search"), "--json")
    assert code == 0, err
    result = json.loads(out)
    states = {r["params"]["model.name"]: r["state"] for r in result["trials"]}
    assert states == {"hpctrain:tiny_cnn": "complete", "hpctrain:no_such_model": "fail"}
    assert "failed (exit 2)" in err and "no_such_model" in err
    assert (tmp_path / "search" / "logs" / "trial-0001.log").is_file() or \
        (tmp_path / "search" / "logs" / "trial-0000.log").is_file()


@pytest.mark.distributed
def test_a_ddp_trial_is_pruned_on_both_ranks(run_cli, tiny, tmp_path):
    """A study whose first trial was perfect at every evaluation: the next trial, two
    processes under torchrun, is pruned at its first evaluation and both ranks stop there."""
    folder, search = _prepared(tiny, tmp_path, "train.epochs=4", "train.eval_every_epochs=1",
                               processes_per_trial=2)
    study = open_study(folder, search)
    study.add_trial(create_trial(
        params={"optim.lr": 0.1}, distributions={"optim.lr": space.parse(LR).distribution()},
        value=1.0, intermediate_values={n: 1.0 for n in range(1, 5)}))
    code, out, err = run_cli("tune", "default", *tiny("train.epochs=4",
                                                      "train.eval_every_epochs=1"),
                             "--space", LR, "--trials", "2", "--processes-per-trial", "2",
                             "--dir", str(folder), "--json")
    assert code == 0, err
    row = json.loads(out)["trials"][1]
    log = (folder / "logs" / "trial-0001.log").read_text()
    assert row["state"] == "pruned", log[-3000:]
    summary = RunDir(Path(row["run_dir"])).read_summary()
    assert summary["status"] == "pruned" and summary["world_size"] == 2
    assert summary["steps"] == 5  # 160 samples / (16 x 2 ranks): the first evaluation
    assert "pruned by the study after evaluation 1" in log


def test_a_trial_left_by_a_lost_worker_is_failed_and_retried_in_its_run_directory(tiny,
                                                                                  tmp_path):
    folder, search = _prepared(tiny, tmp_path)
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


def test_a_trial_run_by_hand_reports_to_an_unreachable_study_and_trains_on(tiny_config,
                                                                          tmp_path, capfd):
    from hpctrain.train.loop import train

    summary = train(tiny_config("train.max_steps=4", f"trial.study_dir={tmp_path / 'none'}",
                                "trial.number=0"))
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert "cannot reach trial 0 of the study" in capfd.readouterr().err


# --- on the local Slurm cluster ----------------------------------------------------------

def _started(folder: Path) -> list[int]:
    """Trial numbers as the element logs say they started (a resume is not a start)."""
    import re

    text = "".join(p.read_text() for p in folder.glob("slurm-*.out"))
    return sorted(int(n) for n in re.findall(r"trial (\d+) started", text))


@pytest.mark.slurm
def test_a_two_element_array_runs_four_trials_each_exactly_once(slurm_cluster, home, tiny,
                                                                 tmp_path, run_cli):
    from hpctrain.cluster.jobs import Job

    folder = tmp_path / "search"
    code, out, err = run_cli("tune", "default", *tiny("train.max_steps=6"), "--space", LR,
                             "--trials", "4", "--parallel", "2", "--submit", "--gpus", "1",
                             "--time", "10", "--dir", str(folder), "--json")
    assert code == 0, err
    job = Job(json.loads(out)["job_id"])
    assert job.wait(timeout=400, poll=0.2) == "COMPLETED", job.status()
    assert sorted(job.status()["elements"]) == ["0", "1"]
    study = open_study(folder, read_search(folder))
    trials = study.get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert _started(folder) == [0, 1, 2, 3]
    for trial in trials:
        run = RunDir(folder / f"trial-{trial.number:04d}")
        assert run.read_summary()["steps"] == 6 and len(read_identity(run.path)[0]["starts"]) == 1
    assert (folder / "best.yaml").is_file()  # the last worker wrote the results
    script = (folder / "job.sbatch").read_text()
    assert "#SBATCH --array=0-1" in script and "tune worker" in script


@pytest.mark.slurm
def test_a_trial_preempted_by_sigusr1_resumes_as_the_same_trial(slurm_cluster, home, tiny,
                                                                 tmp_path, run_cli):
    from hpctrain.cluster.jobs import Job

    folder = tmp_path / "search"
    code, out, err = run_cli("tune", "default", *tiny("train.max_steps=600",  # 8 s of steps
                                                      "train.log_every=7",
                                                      "checkpoint.every_steps=100000"),
                             "--space", LR, "--trials", "1", "--submit", "--gpus", "1",
                             "--time", "10", "--dir", str(folder), "--json")
    assert code == 0, err
    job = Job(json.loads(out)["job_id"])
    metrics = folder / "trial-0000" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 2):
        assert time.monotonic() < deadline, job.status()
        time.sleep(0.2)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job.id], check=True)
    state = job.wait(timeout=400, poll=0.2)  # an element follows its continuation
    logs = "".join(p.read_text() for p in sorted(folder.glob("slurm-*")))
    assert state == "COMPLETED", logs[-3000:]
    trials = open_study(folder, read_search(folder)).get_trials()
    assert len(trials) == 1 and trials[0].state == TrialState.COMPLETE
    run = RunDir(folder / "trial-0000")
    summary = run.read_summary()
    assert summary["steps"] == 600 and summary["restarts"] == 1
    assert len(read_identity(run.path)[0]["starts"]) == 2
    assert "trial 0 started" in logs and "trial 0 resumed" in logs
    assert "stopped early" in logs


# --- the scaling study --------------------------------------------------------------------

@pytest.mark.distributed
def test_scale_with_one_and_two_processes_makes_the_table_and_a_recommendation(run_cli, tiny,
                                                                                tmp_path):
    folder = tmp_path / "study"
    code, out, err = run_cli("scale", "default", *tiny(), "--gpus", "1,2", "--steps", "12",
                             "--dir", str(folder), "--json")
    assert code == 0, err
    result = json.loads(out)
    one, two = result["rows"]
    assert (one["size"], two["size"]) == (1, 2) and result["mode"] == "weak"
    assert (one["global_batch_size"], two["global_batch_size"]) == (16, 32)
    assert one["efficiency"] == 1.0 and one["speedup"] == 1.0
    assert two["efficiency"] == pytest.approx(two["samples_per_second"]
                                              / (2 * one["samples_per_second"]))
    for row in (one, two):
        summary = RunDir(Path(row["run_dir"])).read_summary()
        assert summary["steps"] == 12 and summary["world_size"] == row["size"]
        assert row["epoch_seconds"] == pytest.approx(160 / row["samples_per_second"])
        assert row["epoch_gpu_hours"] == pytest.approx(row["epoch_seconds"] * row["size"]
                                                       / 3600)
    expected = 2 if two["efficiency"] >= 0.8 else 1
    assert result["recommended"] == expected
    assert (result["limit"] is None) == (expected == 2)
    assert expected == 2 or "share this machine's CPU cores" in result["limit"]
    assert (folder / "scale.png").read_bytes()[:4] == b"\x89PNG"
    code, out, _ = run_cli("scale", "status", str(folder))
    assert code == 0 and f"recommended: {expected} device(s)" in out
    assert out.count("\n") >= 4 and "efficiency" in out


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


def test_a_search_keeps_its_study_in_postgresql(postgres, run_cli, tiny, tmp_path):
    """--storage postgresql://...: the trials' reports and results go to the server (psycopg
    3 through SQLAlchemy), and the folder holds no journal."""
    import psycopg

    with psycopg.connect(postgres.url, autocommit=True) as connection:
        connection.execute("CREATE DATABASE study")
    url = postgres.url.rsplit("/", 1)[0] + "/study"
    folder = tmp_path / "search"
    code, out, err = run_cli("tune", "default", *tiny("train.max_steps=4",
                                                      "train.eval_every_epochs=0.2"),
                             "--space", LR, "--trials", "2", "--storage", url,
                             "--dir", str(folder), "--json")
    assert code == 0, err
    assert json.loads(out)["states"] == {"complete": 2}
    assert not (folder / "study.journal").exists()
    study = optuna.load_study(study_name="hpctrain", storage=url.replace(
        "postgresql:", "postgresql+psycopg:"))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    assert all(t.intermediate_values for t in study.trials)  # reported from the loop


@pytest.mark.slurm
def test_a_scaling_study_runs_one_job_per_size_on_the_cluster(slurm_cluster, home, tiny,
                                                               tmp_path, run_cli):
    from hpctrain.cluster.jobs import Job

    folder = tmp_path / "study"
    code, _, err = run_cli("scale", "default", *tiny(), "--gpus", "1,2", "--steps", "12",
                           "--submit", "--time", "10", "--dir", str(folder))
    assert code == 2 and "could never start" in err  # 2 x 8 CPUs: refused before any job
    assert not list(folder.glob("gpus-*"))
    code, out, err = run_cli("scale", "default", *tiny(), "--gpus", "1,2", "--steps", "12",
                             "--submit", "--time", "10", "--cpus-per-gpu", "2",
                             "--dir", str(folder), "--json")
    assert code == 0, err
    jobs = json.loads(out)["jobs"]
    for job_id in jobs.values():
        assert Job(job_id).wait(timeout=300, poll=0.2) == "COMPLETED"
    code, out, err = run_cli("scale", "status", str(folder), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [r["size"] for r in result["rows"]] == [1, 2] and result["recommended"] in (1, 2)
    assert RunDir(folder / "gpus-2").read_summary()["launcher"] == "slurm"


def test_ctrl_c_saves_the_running_trials_and_tune_dir_resumes_them(tiny, tmp_path):
    """Ctrl-C in a terminal reaches `hpctrain tune` alone (its trials run in sessions of their
    own); it stops each trial with the preemption signal, which saves, and ends with 75. The
    search then continues from its folder, each trial where it stopped."""
    import signal

    from conftest import run_installed

    folder = tmp_path / "search"
    script = Path(os.path.dirname(sys.executable)) / "hpctrain"
    tune = subprocess.Popen(
        [str(script), "tune", "default", *tiny("train.max_steps=500", "train.log_every=7",
                                               "checkpoint.every_steps=100000"),
         "--space", LR, "--trials", "1", "--dir", str(folder)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = folder / "trial-0000" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 2):
        assert time.monotonic() < deadline and tune.poll() is None
        time.sleep(0.2)
    tune.send_signal(signal.SIGINT)
    out, _ = tune.communicate(timeout=120)
    assert tune.returncode == 75, out
    assert "continue with: hpctrain tune --dir" in out
    summary = RunDir(folder / "trial-0000").read_summary()
    assert summary["status"] == "preempted" and summary["steps"] < 500
    assert open_study(folder, read_search(folder)).trials[0].state == TrialState.RUNNING
    done = run_installed("tune", "--dir", str(folder), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert [(r["trial"], r["state"], r["steps"]) for r in result["trials"]] == \
        [(0, "complete", 500)]
    assert "trial 0 resumed" in done.stderr
    assert len(read_identity(folder / "trial-0000")[0]["starts"]) == 2


def test_the_final_evaluation_is_reported_but_never_prunes(run_cli, tiny, tmp_path):
    """A trial worse than every other at its last evaluation has nothing left to save by
    stopping: it ends complete, with its value."""
    folder, search = _prepared(tiny, tmp_path, "train.max_steps=6")
    study = open_study(folder, search)
    study.add_trial(create_trial(
        params={"optim.lr": 0.1}, distributions={"optim.lr": space.parse(LR).distribution()},
        value=1.0, intermediate_values={1: 1.0}))
    code, out, err = run_cli("tune", "--dir", str(folder), "--json")
    assert code == 0, err
    row = json.loads(out)["trials"][1]
    assert row["state"] == "complete" and row["evaluations"] == 1 and row["value"] < 1.0


def test_a_study_or_search_that_cannot_be_opened_is_exit_2(run_cli, tiny, tmp_path):
    code, _, err = run_cli("tune", "default", *tiny(), "--space", LR, "--trials", "2",
                           "--storage", "postgresql://someone@127.0.0.1:9/study",
                           "--dir", str(tmp_path / "search"))
    assert code == 2 and "cannot open the study's database" in err
    assert len(err.strip().splitlines()) == 1 and "password" not in err
    code, _, err = run_cli("tune", "status", str(tmp_path))
    assert code == 2 and "not a search folder (no tune.json)" in err


# what a study of each task optimises, as a researcher would choose it (not read from the
# code): a classifier's best accuracy, a language model's lowest loss (its perplexity)
STUDIES_OPTIMISE = {"image_classification": "best_val_accuracy:max",
                    "language_modeling": "best_val_loss:min",
                    "point_cloud_classification": "best_val_accuracy:max"}


@pytest.mark.parametrize("recipe, task, extra", [
    ("default", "image_classification", ["model.name=hpctrain:tiny_cnn", "data.image_size=16",
                                         "data.shapes.image_size=16", "data.shapes.num_train=64",
                                         "data.shapes.num_val=16", "train.batch_size=16"]),
    ("tiny-lm", "language_modeling", ["data.dataset=arithmetic",
                                      "data.arithmetic.num_train=200",
                                      "data.arithmetic.num_val=16", "data.tokens.seq_len=32",
                                      "model.kwargs.width=32", "model.kwargs.layers=1",
                                      "train.max_steps=4", "train.batch_size=8"]),
    ("pointnet", "point_cloud_classification", ["data.shapes3d.num_train=32",
                                                "data.shapes3d.num_val=10",
                                                "data.points.num_points=64",
                                                "model.kwargs.width=0.125", "train.max_steps=4",
                                                "train.batch_size=4"]),
])
def test_the_default_objective_is_the_tasks_own(run_cli, tmp_path, recipe, task, extra):
    """Before, the default compared the task with "language" while it is called
    "language_modeling": language-model studies maximised accuracy."""
    caches = [f"data.{kind}.cache_dir={tmp_path / kind}"
              for kind in ("shapes", "arithmetic", "shapes3d")]
    code, out, err = run_cli("tune", recipe, f"output_dir={tmp_path}", *caches, *extra,
                             "train.epochs=1", "data.num_workers=0", "tensorboard=false",
                             "report=false", "--space", LR, "--trials", "1", "--dir",
                             str(tmp_path / "search"), "--json")
    assert code == 0, err[-3000:]
    result = json.loads(out)
    key, direction = STUDIES_OPTIMISE[task].split(":")
    assert (result["objective"], result["direction"]) == (key, direction + "imize")
    trial, = result["trials"]
    summary = RunDir(Path(trial["run_dir"])).read_summary()
    assert summary["task"] == task and trial["value"] == summary[key] is not None
    from hpctrain.tasks.registry import KIND_OF_TASK
    from hpctrain.tasks.tensors import KIND as TENSORS
    tested = {"image_classification", "language_modeling", "point_cloud_classification"}
    assert {t for t in TASK_OBJECTIVE if KIND_OF_TASK[t] != TENSORS} == tested  # tensors':
    assert tested <= set(TASK_OF_DATA.values())  # test_tensors.py's tune
