"""`hpctrain tune`: the search space, a local search with pruning whose trials are normal run
directories, a crashed trial, a DDP trial pruned on both ranks, stale trials retried in their
own run directory, and the search as a Slurm array job (with a trial preempted by SIGUSR1
that resumes as the same trial).

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_tune.py, tests/cluster/test_tune.py."""

import json
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
from hpctrain.runs.directory import RunDir
from hpctrain.runs.identity import read_identity
from hpctrain.tune import space
from hpctrain.tune.study import OBJECTIVES, open_study, read_search
from tune_studies import LR, prepared

STRIPES = f"{Path(__file__).parent.parent / 'fixtures' / 'stripes.py'}:stripes"


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
        "data.images.image_size=8", "data.num_workers=0", "model.name=hpctrain:tiny_cnn",
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


def test_a_trial_run_by_hand_reports_to_an_unreachable_study_and_trains_on(tiny_config,
                                                                          tmp_path, capfd):
    from hpctrain.train.loop import train

    summary = train(tiny_config("train.max_steps=4", f"trial.study_dir={tmp_path / 'none'}",
                                "trial.number=0"))
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert "cannot reach trial 0 of the study" in capfd.readouterr().err


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
    folder, search = prepared(tiny, tmp_path, "train.max_steps=6")
    study = open_study(folder, search)
    study.add_trial(create_trial(
        params={"optim.lr": 0.1}, distributions={"optim.lr": space.parse(LR).distribution()},
        value=1.0, intermediate_values={1: 1.0}))
    code, out, err = run_cli("tune", "--dir", str(folder), "--json")
    assert code == 0, err
    row = json.loads(out)["trials"][1]
    assert row["state"] == "complete" and row["evaluations"] == 1 and row["value"] < 1.0


# what a study of each task optimises, as a researcher would choose it (not read from the
# code): a classifier's best accuracy, a language model's lowest loss (its perplexity)
STUDIES_OPTIMISE = {"image_classification": "best_val_accuracy:max",
                    "language_modeling": "best_val_loss:min",
                    "point_cloud_classification": "best_val_accuracy:max"}


@pytest.mark.parametrize("recipe, task, extra", [
    ("default", "image_classification", ["model.name=hpctrain:tiny_cnn",
                                         "data.images.image_size=16", "data.shapes.image_size=16",
                                         "data.shapes.num_train=64", "data.shapes.num_val=16",
                                         "train.batch_size=16"]),
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
