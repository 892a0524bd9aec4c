"""`hpctrain tune`: the tests that start several processes or a server (torchrun, Slurm,
PostgreSQL, the browser, the model hub) (the others are tests/unit/test_tune.py,
tests/runs/test_tune.py)."""

import json
import subprocess
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState, create_trial

from hpctrain.runs.directory import RunDir
from hpctrain.runs.identity import read_identity
from hpctrain.tune import space
from hpctrain.tune.study import open_study, read_search
from tune_studies import LR, prepared


@pytest.mark.distributed
def test_a_ddp_trial_is_pruned_on_both_ranks(run_cli, tiny, tmp_path):
    """A study whose first trial was perfect at every evaluation: the next trial, two
    processes under torchrun, is pruned at its first evaluation and both ranks stop there."""
    folder, search = prepared(tiny, tmp_path, "train.epochs=4", "train.eval_every_epochs=1",
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
