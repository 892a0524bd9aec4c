"""A stop at any moment: the tests that start several processes or a server (torchrun, Slurm,
PostgreSQL, the browser, the model hub) (the others are tests/runs/test_stops.py)."""

import json
import re
from pathlib import Path

import pytest

from hpctrain.runs.directory import list_checkpoints
from launching import one_thread_env
from stop_recipes import CHECKED, VAL, evaluations, stripes, trains


# ---- stops that lost or doubled records (issue 51, item 8): one process and two on gloo ----

KILLED_IN_SAVE = str(Path(__file__).parent.parent / "fixtures" / "killed_in_save.py")


def launch(nproc: int, args: list[str], timeout: float = 300,
           script: str | None = None) -> tuple[int, str]:
    """`hpctrain run default ARGS` in one process, or in `nproc` torchrun workers on gloo
    (`script`: a Python file standing for `hpctrain`): (the exit codes of the run's
    processes, their output)."""
    import subprocess
    import sys

    program = [script] if script else ["-m", "hpctrain"]
    command = [sys.executable, *program, "run", "default", *args] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={nproc}", *(program if script else ["-m", "hpctrain"]), "run",
         "default", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env=one_thread_env())
    said = done.stdout + done.stderr
    if nproc == 1 or done.returncode == 0:
        return {done.returncode}, said
    return {int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", said)}, said


PROCESSES = [1, pytest.param(2, marks=pytest.mark.distributed)]


@pytest.mark.parametrize("nproc", PROCESSES)
def test_a_stop_in_the_final_evaluation_logs_the_last_short_interval_once(tmp_path, tiny,
                                                                          nproc):
    """The last step (60) not a multiple of train.log_every (7), a stop during the final
    evaluation: its interval was logged a second time with no steps (before: a record of
    loss NaN and 0 samples/s that stayed after the resume; with two processes a
    ZeroDivisionError on every rank, exit 70, a job that would not requeue)."""
    run = tmp_path / "runs" / "odd"
    args = stripes(tiny, "odd", "train.log_every=7", "train.global_batch_size=16",
                   "data.kwargs.signal=SIGUSR1")
    codes, said = launch(nproc, [*args, f"data.kwargs.at={CHECKED + 2 * (VAL // nproc) + 3}"])
    assert codes == {75} and "internal error" not in said, said[-3000:]  # torchrun's own
    steps = [r["step"] for r in trains(run)]  # traceback for a worker's exit 75 aside
    assert steps == [7, 14, 21, 28, 35, 42, 49, 56, 60], steps
    assert all(r["samples_per_second"] > 0 and r["loss"] == r["loss"] for r in trains(run))
    codes, said = launch(nproc, [*args, "resume=auto"])
    assert codes == {0}, said[-3000:]
    assert [r["step"] for r in trains(run)] == steps
    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]


@pytest.mark.parametrize("nproc", PROCESSES)
def test_kills_at_every_moment_leave_each_record_once_and_every_start_counted(tmp_path, tiny,
                                                                              nproc):
    """One run through six jobs, each ended as a machine or a user ends jobs: SIGKILL during
    start-up (before the run reported), SIGKILL at step 15 (before the first checkpoint),
    SIGKILL in the middle of the first save (the evaluation at step 20 recorded, the
    checkpoint not published), SIGUSR1 during the final evaluation (saved, owed), SIGKILL
    in the save after the owed evaluation, then a resume that finishes. Before (issue 51):
    train records twice, evaluations [20, 20, 40, 60] or [20, 40, 60, 60], summary.json's
    restarts 0 where run.json listed two starts, and no start at all for the first job."""
    run = tmp_path / "runs" / "kills"
    args = stripes(tiny, "kills", "train.global_batch_size=16", "resume=auto")
    per_rank = 16 // nproc

    def job(*extra: str, script: str | None = None) -> set[int]:
        return launch(nproc, [*args, *extra], script=script)[0]

    def killed(codes: set[int]) -> bool:  # SIGKILL; under torchrun the other rank then fails
        return -9 in codes and codes <= {-9, 1}

    at_start = ["data.kwargs.split=train", "data.kwargs.signal=SIGKILL"]
    assert killed(job(*at_start, "data.kwargs.at=2"))  # the check before training
    assert not (run / "run.json").exists() and not (run / "metrics.jsonl").exists()
    assert killed(job(*at_start, f"data.kwargs.at={CHECKED + per_rank * 14 + 5}"))
    assert [r["step"] for r in trains(run)] == [5, 10] and not list_checkpoints(
        run / "checkpoints")
    assert killed(job(script=KILLED_IN_SAVE))
    assert [r["step"] for r in evaluations(run)] == [20] and not list_checkpoints(
        run / "checkpoints")
    assert job("data.kwargs.signal=SIGUSR1",
               f"data.kwargs.at={CHECKED + 2 * (VAL // nproc) + 3}") == {75}
    assert [r["step"] for r in evaluations(run)] == [20, 40]
    assert killed(job(script=KILLED_IN_SAVE))  # after the owed evaluation, in its save
    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]
    codes, said = launch(nproc, args)
    assert codes == {0}, said[-3000:]

    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]
    assert [r["step"] for r in trains(run)] == list(range(5, 61, 5))
    summary = json.loads((run / "summary.json").read_text())
    starts = json.loads((run / "run.json").read_text())["starts"]
    assert summary["status"] == "completed" and summary["final_val_accuracy"] > 0.9
    assert len(starts) == 6 and summary["restarts"] == 5
    assert [bool(s.get("lost")) for s in starts] == [True, True, True, False, True, False]
    assert starts[0]["lost"].startswith("during start-up, before it reported")
    assert all(s["seconds"] >= 0 for s in starts)
