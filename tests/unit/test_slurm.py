"""`hpctrain submit`, `jobs`, `logs`, `status`, `cancel` and the Python API, against a real
two-node Slurm cluster started by the suite (slurm_cluster.py), plus the generated script:
the tests that need no training run, no process and no server (the others are
tests/runs/test_slurm.py, tests/cluster/test_slurm.py)."""

import json
import sys
from pathlib import Path

import pytest

from hpctrain.cluster.jobs import Job, plan
from hpctrain.cluster.profiles import get_profile
from hpctrain.cluster.request import JobRequest
from hpctrain.cluster.sbatch import render
from hpctrain.errors import ConfigError

GOLDEN = Path(__file__).parent.parent / "golden"


def test_the_jean_zay_a100_script_matches_the_reviewed_golden_file(monkeypatch):
    """Submitted from a virtualenv: the job runs its python after the profile's modules (the
    module's own python3 has no hpctrain, and an older torch: issue 53), and says so."""
    monkeypatch.setattr(sys, "executable", "/lustre/fswork/abc/venv/bin/python")
    monkeypatch.setattr(sys, "prefix", "/lustre/fswork/abc/venv")
    request = JobRequest(gpus=16, time="20:00:00", run_dir=Path("/lustre/fswork/abc/runs/rn50"),
                         recipe="imagenet-resnet50", account="abc",
                         overrides=["data.path=/lustre/fsn1/datasets/imagenet"])
    script = render(request, get_profile("jean-zay-a100", {}))
    assert script == (GOLDEN / "jean-zay-a100-2x8.sbatch").read_text()


def test_layouts_and_limits_are_checked_before_anything_is_written():
    profile = get_profile("jean-zay-h100", {})
    with pytest.raises(ConfigError, match="use 4 or 8"):
        render(JobRequest(gpus=6, time="1:00:00", run_dir=Path("/r/x")), profile)
    with pytest.raises(ConfigError, match="exceeds jean-zay-h100's limit of 20:00:00"):
        render(JobRequest(gpus=4, time="2-00:00:00", run_dir=Path("/r/x")), profile)
    with pytest.raises(ConfigError, match="Slurm's formats"):
        render(JobRequest(gpus=4, time="soon", run_dir=Path("/r/x")), profile)
    with pytest.raises(ConfigError, match="unknown cluster profile 'jean-zay-a10'.*a100"):
        get_profile("jean-zay-a10", {})


def test_submit_without_slurm_says_where_to_run(monkeypatch, tmp_path, run_cli, tiny, home):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    code, _, err = run_cli("submit", "default", *tiny(), "--gpus", "1", "--time", "10")
    assert code == 2 and "'sbatch' is not on PATH: is this a Slurm login node?" in err


def test_a_recipe_typo_fails_at_submit_not_in_the_queue(run_cli, tiny, home):
    code, _, err = run_cli("submit", "default", *tiny("train.bach_size=3"), "--gpus", "1",
                           "--dry-run")
    assert code == 2 and "did you mean 'train.batch_size'" in err


def test_a_profile_naming_a_scheduler_hpctrain_does_not_speak_to_is_refused(run_cli, tiny,
                                                                            home, tmp_path,
                                                                            monkeypatch):
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text("pbs-site:\n  scheduler: pbs\n")
    monkeypatch.setenv("HPCTRAIN_CLUSTERS", str(profiles))
    code, out, err = run_cli("submit", "default", *tiny(), "--gpus", "1", "--cluster",
                             "pbs-site", "--dry-run")
    assert code == 2 and not out
    assert err.strip().splitlines() == ["hpctrain: error: cluster profile: unknown scheduler "
                                        "'pbs'; hpctrain speaks to slurm"]


def test_submit_sizes_a_model_parallel_job_for_its_layout(home, tmp_path):
    """Whole model copies per job, and each tensor-parallel group on one node (the default
    profile's nodes have 4 GPUs), refused before anything queues."""
    layout = [f"output_dir={tmp_path}", "parallel.tensor=2", "parallel.pipeline=2"]
    _, script = plan("tiny-lm", layout, 8, "10")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=4" in script
    with pytest.raises(ConfigError, match="--gpus 6: .* 4 GPUs per model copy; use --gpus 4 "
                                          "or 8"):
        plan("tiny-lm", layout, 6, "10")
    with pytest.raises(ConfigError, match="parallel.tensor=8: a tensor-parallel group must "
                                          "sit on one node, but this job puts 4"):
        plan("tiny-lm", [f"output_dir={tmp_path}", "parallel.tensor=8",
                         "model.kwargs.heads=8"], 8, "10")


def test_submit_with_resume_continues_that_run_from_that_checkpoint(run_cli, tiny, home,
                                                                      tmp_path):
    """`resume=` a checkpoint: the job lives in its run directory and starts from it; the
    job's own continuations take the newest checkpoint (before, resume=auto overrode it and
    the job started from scratch in a new folder)."""
    checkpoint = tmp_path / "old-run" / "checkpoints" / "step_00000040"
    checkpoint.mkdir(parents=True)
    (checkpoint / "meta.json").write_text(json.dumps({"step": 40, "world_size": 1}))
    request, script = plan("default", tiny(f"resume={checkpoint}"), 1, "10")
    assert request.run_dir == tmp_path / "old-run"
    assert f"[ $(( ${{SLURM_RESTART_COUNT:-0}} + ${{HPCTRAIN_RESTARTS:-0}} )) -eq 0 ] && " \
        f"resume={checkpoint}" in script
    assert "run_name=old-run" in script and script.count('"resume=$resume"') == 1
    assert f"resume={checkpoint} " not in script.split("srun ", 1)[1]  # only via $resume
    assert plan("default", tiny(f"resume={tmp_path / 'old-run'}"), 1, "10")[0].run_dir == \
        tmp_path / "old-run"
    code, _, err = run_cli("submit", "default", *tiny(f"resume={tmp_path}"), "--gpus", "1",
                           "--time", "10", "--dry-run")
    assert code == 2 and f"resume={tmp_path}: no checkpoint there" in err


def test_the_job_ledger_skips_lines_that_are_not_records(home, capsys):
    from hpctrain.runs.directory import ledger_path

    ledger = ledger_path()
    ledger.parent.mkdir(parents=True)
    ledger.write_text('[1, 2]\n"text"\n{"job_id": 5, "run_dir": "/r"}\n{"job_id": "7", "run_'
                      '\n{"job_id": "8", "run_dir": "/runs/eight"}\n')
    assert Job("8").run_dir == Path("/runs/eight")
    assert Job("5").run_dir is None  # a number is not a job id record
    err = capsys.readouterr().err
    assert f"{ledger}:1 is not a job record" in err and f"{ledger}:3 is not" in err
    assert f"{ledger}:4" not in err  # a line torn by a crash is skipped quietly
