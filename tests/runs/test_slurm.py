"""`hpctrain submit`, `jobs`, `logs`, `status`, `cancel` and the Python API, against a real
two-node Slurm cluster started by the suite (slurm_cluster.py), plus the generated script:
the tests that train, in this process or in an `hpctrain` process of their own (the others
are tests/unit/test_slurm.py, tests/cluster/test_slurm.py)."""

import subprocess
import sys

import pytest

from hpctrain.cluster.jobs import plan
from hpctrain.cluster.profiles import get_profile
from hpctrain.cluster.request import JobRequest
from hpctrain.cluster.sbatch import render
from hpctrain.errors import ConfigError


def test_user_values_cannot_run_anything(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ConfigError, match="--job-name"):
        render(JobRequest(gpus=1, time="10", run_dir=tmp_path / "r",
                          job_name=f"x\n#SBATCH --wrap=touch {marker}"), get_profile(None, {}))
    with pytest.raises(ConfigError, match="--account"):
        render(JobRequest(gpus=1, time="10", run_dir=tmp_path / "r", account="a`id`"),
               get_profile(None, {}))
    script = render(JobRequest(gpus=1, time="10", run_dir=tmp_path / "r",
                               modules=[f"x; touch {marker}", f"$(touch {marker})"],
                               venv=f"/v`touch {marker}`",
                               overrides=[f"data.path=$(touch {marker})", f"a=`touch {marker}`"]),
                    get_profile(None, {}))
    # run the script's shell lines with stand-ins for the site commands it calls
    body = script.split("\n\n", 1)[1]
    stubs = "module() { :; }; source() { :; }; srun() { :; }; scontrol() { :; }\n"
    subprocess.run(["bash", "-c", stubs + body], capture_output=True, timeout=30)
    assert not marker.exists()


def test_submit_autotune_refuses_a_budget_that_is_no_duration_and_a_sweep(run_cli, tiny, home):
    code, _, err = run_cli("submit", "default", *tiny(), "--gpus", "1", "--autotune", "ten",
                           "--dry-run")
    assert code == 2 and "--autotune: 'ten' is not a duration: give 90s, 10m or 2h" in err
    code, _, err = run_cli("submit", "default", *tiny(), "--gpus", "1", "--autotune",
                           "--sweep", "optim.lr=0.1,0.2", "--dry-run")
    assert code == 2 and "--autotune with --sweep: tune once" in err
    code, out, _ = run_cli("submit", "default", *tiny(), "--gpus", "1", "--autotune", "5m",
                           "--dry-run")
    assert code == 0 and "--processes 1 --budget 300" in out and "tuned.yaml" in out


def test_dry_run_writes_the_script_it_names_and_submits_nothing(run_cli, tiny, home, tmp_path):
    """Before, the preview said "Submit it again with: sbatch RUN/job.sbatch", a file it never
    wrote; now that file holds the script printed, and nothing else was made or sent."""
    code, out, err = run_cli("submit", "default", *tiny("run_name=dry"), "--gpus", "8",
                             "--time", "2:00:00", "--dry-run")
    assert code == 0 and out.startswith("#!/bin/bash")
    assert "#SBATCH --nodes=2" in out and "#SBATCH --ntasks-per-node=4" in out
    script = tmp_path / "runs" / "dry" / "job.sbatch"
    assert "resume=auto" in out and script.read_text() == out
    assert f"Submit it again with: sbatch {script}" in out
    assert f"nothing submitted; the script is written to {script}" in err
    assert [path.name for path in script.parent.iterdir()] == ["job.sbatch"]  # no job record
    assert plan("default", tiny("run_name=dry"), 8, "2:00:00")[0].run_dir.name == "dry"


def test_extra_sbatch_takes_a_directive_that_starts_with_a_dash(run_cli, tiny, home):
    code, out, err = run_cli("submit", "default", *tiny(), "--gpus", "1", "--dry-run",
                             "--extra-sbatch", "--mail-type=END")
    assert code == 0, err
    assert "#SBATCH --mail-type=END\n" in out


USER_MODEL = """
from torch import nn

def build(num_classes, width=4):
    return nn.Sequential(nn.Conv2d(3, width, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, num_classes))
"""


def test_submit_checks_that_user_code_imports_and_runs_it_from_the_submit_directory(
        run_cli, tiny, home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_net.py").write_text(USER_MODEL)
    code, out, err = run_cli("submit", "default", *tiny("run_name=mine"),
                             "model.name=user_net.py:build", "--gpus", "1", "--time", "10",
                             "--dry-run")
    assert code == 0, err
    assert f"#SBATCH --chdir={tmp_path}\n" in out
    assert f"export PYTHONPATH={tmp_path}${{PYTHONPATH:+:$PYTHONPATH}}" in out
    (tmp_path / "broken_net.py").write_text("import torch\nimport not_installed_here\n")
    code, _, err = run_cli("submit", "default", *tiny("run_name=broken"),
                           "model.name=broken_net.py:build", "--gpus", "1", "--time", "10",
                           "--dry-run")
    assert code == 2
    assert "model.name: " in err and "broken_net.py:build does not import: " \
        "ModuleNotFoundError: No module named 'not_installed_here' (at broken_net.py:2) " \
        f"[checked at submission with {sys.executable}, the job's python]" in err
