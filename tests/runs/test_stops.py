"""A stop at any moment: the run is complete only once its final weights are evaluated, an
evaluation a stop cuts short is done after the resume, and metrics.jsonl tells each scheduled
evaluation once, in step order.

The stop comes from inside the run (fixtures/signalling.py: the n-th sample drawn sends the
signal), so its moment is exact: during the first, a middle or the final evaluation, or
during a training step.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/cluster/test_stops.py."""

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from hpctrain.errors import ExitCode
from hpctrain.runs.directory import list_checkpoints
from hpctrain.train.checkpoints.checkpoint import read_checkpoint
from stop_recipes import CHECKED, VAL, evaluations, stripes


def final_weights(run: Path) -> dict:
    return read_checkpoint(list_checkpoints(run / "checkpoints")[-1])["model"]


@pytest.fixture
def undisturbed(tmp_path, tiny, run_cli):
    code, _, err = run_cli("run", "default", *stripes(tiny, "undisturbed"))
    assert code == 0, err
    run = tmp_path / "runs" / "undisturbed"
    return json.loads((run / "summary.json").read_text()), final_weights(run), evaluations(run)


@pytest.mark.parametrize("signal", ["SIGTERM", "SIGUSR1"])
def test_a_stop_during_the_final_evaluation_leaves_the_run_to_the_resume(
        tmp_path, tiny, run_cli, undisturbed, signal):
    """Before: exit 0, "completed", and the figures of the evaluation before (0.51 where the
    final weights score 0.99); resume=auto then left it so."""
    summary, weights, _ = undisturbed
    run = tmp_path / "runs" / "final"
    args = stripes(tiny, "final", f"data.kwargs.signal={signal}")
    code, _, err = run_cli("run", "default", *args, f"data.kwargs.at={CHECKED + 2 * VAL + 3}")
    assert code == 75, err
    assert "stopped at step 60" in err and "during its evaluation" in err
    stopped = json.loads((run / "summary.json").read_text())
    assert stopped["status"] == "preempted" and stopped["steps"] == 60
    assert [r["step"] for r in evaluations(run)] == [20, 40]
    assert list_checkpoints(run / "checkpoints")[-1].name == "step_00000060"

    code, out, err = run_cli("run", "default", *args, "resume=auto")
    assert code == 0, err
    assert "the evaluation a stop cut short, done now" in out
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["restarts"] == 1
    assert resumed["final_val_accuracy"] == summary["final_val_accuracy"] > 0.9
    assert resumed["best_val_accuracy"] == summary["best_val_accuracy"]
    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]
    assert all(torch.equal(weights[k], v) for k, v in final_weights(run).items())

    code, out, _ = run_cli("run", "default", *args, "resume=auto")  # now it is complete
    assert code == 0 and "already complete" in out
    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]


@pytest.mark.parametrize("split, at, stopped_at", [
    ("val", CHECKED + 3, 20),  # during the first evaluation
    ("val", CHECKED + VAL + 150, 40),  # late in a middle one
    ("train", CHECKED + 16 * 45 + 5, 46),  # during a training step (step 46's batch)
])
def test_every_scheduled_evaluation_is_recorded_once_in_step_order_whatever_the_stop(
        tmp_path, tiny, run_cli, undisturbed, split, at, stopped_at):
    summary, weights, scheduled = undisturbed
    run = tmp_path / "runs" / "moment"
    args = stripes(tiny, "moment", f"data.kwargs.split={split}")
    code, _, err = run_cli("run", "default", *args, f"data.kwargs.at={at}")
    assert code == 75 and f"stopped at step {stopped_at}" in err, err
    code, _, err = run_cli("run", "default", *args, "resume=auto")
    assert code == 0, err
    recorded = evaluations(run)
    assert [r["step"] for r in recorded] == [r["step"] for r in scheduled] == [20, 40, 60]
    assert [r["val_accuracy"] for r in recorded] == [r["val_accuracy"] for r in scheduled]
    assert json.loads((run / "summary.json").read_text())["final_val_accuracy"] == \
        summary["final_val_accuracy"]
    assert all(torch.equal(weights[k], v) for k, v in final_weights(run).items())


def test_ctrl_c_during_the_final_evaluation_is_interrupted_not_completed(tmp_path, tiny,
                                                                         run_cli):
    """SIGINT (Ctrl-C) stops at once: no new checkpoint, exit 130, the resume trains the
    steps since the last checkpoint again and evaluates the final weights."""
    run = tmp_path / "runs" / "ctrl-c"
    args = stripes(tiny, "ctrl-c", "data.kwargs.signal=SIGINT")
    code, _, err = run_cli("run", "default", *args, f"data.kwargs.at={CHECKED + 2 * VAL + 3}")
    assert code == 130 and "hpctrain: interrupted at step 60 of 60 (Ctrl-C stops at once; " \
        f"checkpoint {run / 'checkpoints' / 'step_00000040'} is kept: the same command " \
        "with resume=auto continues from it)" in err
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    assert list_checkpoints(run / "checkpoints")[-1].name == "step_00000040"
    code, _, err = run_cli("run", "default", *args, "resume=auto")
    assert code == 0, err
    assert [r["step"] for r in evaluations(run)] == [20, 40, 60]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"


def input_worker(process) -> int:
    """A loader worker of the run `process`."""
    from conftest import loader_workers

    workers = loader_workers(process.pid)
    assert workers, "the run has no loader worker"
    return workers[0]


@pytest.mark.parametrize("loader", ["buffers", "torch"])
def test_a_loader_worker_that_dies_is_one_line_and_its_exit_code_and_the_run_saves(
        tmp_path, tiny, loader):
    """Before: torch's loader raised its RuntimeError as a traceback (exit 1), the batch
    buffers a DataError (exit 2, 'bad input'), and nothing was saved."""
    from launching import start_run, wait_for

    run = tmp_path / "runs" / "dying"
    process = start_run(tiny, "data.num_workers=2", "train.max_steps=100000",
                        "train.log_every=7", "checkpoint.every_steps=100000",
                        "run_name=dying", f"data.loader={loader}")
    metrics = run / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count('"train"') >= 3, process)
    victim = input_worker(process)
    os.kill(victim, signal.SIGKILL)
    _, err = process.communicate(timeout=120)
    assert process.returncode == ExitCode.DATA_PIPELINE == 74, err[-3000:]
    line, = err.strip().splitlines()
    # torch's loader says how it died when it has seen it, and sometimes finds out by a batch
    # that cannot be handed over
    assert line.startswith(f"hpctrain: error: input worker (pid {victim}) was killed by "
                           "SIGKILL") or loader == "torch" and (
        line.startswith(f"hpctrain: error: input worker (pid {victim}) exited unexpectedly")
        or line.startswith("hpctrain: error: an input worker died while handing over"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed"
    saved = list_checkpoints(run / "checkpoints")[-1]
    assert saved.name == f"step_{summary['steps']:08d}" and f"Saved {saved}" in line


def test_stop_signals_after_the_summary_is_written_leave_exit_0(tmp_path, tiny):
    """The run is done once summary.json says so: signals while the process ends (report,
    trackers, the interpreter's exit) changed its status to death by signal."""
    from launching import start_run

    summary = tmp_path / "runs" / "done" / "summary.json"
    process = start_run(tiny, "train.max_steps=6", "run_name=done")
    while not summary.exists():
        assert process.poll() is None, process.communicate()[1][-2000:]
    sent = 0
    while process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal((signal.SIGTERM, signal.SIGUSR1)[sent % 2])
            sent += 1
        time.sleep(0.002)
    _, err = process.communicate()
    assert process.returncode == 0 and sent > 0, err[-2000:]
    assert json.loads(summary.read_text())["status"] == "completed"


def test_one_table_of_exit_codes_in_the_code_the_docs_and_every_help(capsys):
    from hpctrain import cli
    from hpctrain.errors import MEANINGS, exit_code_table

    assert set(MEANINGS) == set(ExitCode)
    page = (Path(__file__).parent.parents[1] / "docs" / "exit-codes.md").read_text()
    assert exit_code_table(markdown=True) in page
    for verb in (["run"], ["submit"], ["memory"], ["tune"], ["runs"], ["bench", "node"], []):
        with pytest.raises(SystemExit):
            cli.main([*verb, "--help"])
        shown = capsys.readouterr().out
        assert "exit status:" in shown and all(f"  {int(code):>3}  " in shown
                                               for code in ExitCode), verb


def test_a_bug_prints_its_traceback_and_exits_internal(tmp_path, tiny, run_cli):
    """A user's mistake is one line and exit 2; anything unexpected (here a bug in the user's
    own model) is its traceback and 70 (it was Python's 1, the code of a failed run)."""
    model = tmp_path / "buggy.py"
    model.write_text("import torch\n\nclass Buggy(torch.nn.Module):\n"
                     "    def __init__(self):\n        super().__init__()\n"
                     "        self.a = torch.nn.Linear(3, 2)\n"
                     "    def forward(self, x):\n        return self.a(x[:, :, 0, 0]) @ None\n"
                     "\ndef make(num_classes):\n    return Buggy()\n")
    code, _, err = run_cli("run", "default", *tiny("train.max_steps=2"),
                           f"model.name={model}:make")
    assert code == ExitCode.INTERNAL == 70
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith(
        "hpctrain: internal error")


@pytest.mark.cold_start  # a stop while torch is imported
def test_every_job_of_a_chain_counts_also_one_stopped_during_start_up(tmp_path, tiny,
                                                                       run_cli):
    """Three jobs: stopped mid-run, stopped during start-up (it saves nothing), finished.
    Before: the second vanished from the figures (its seconds and its restart), and the
    summary disagreed with the number of starts."""
    from launching import start_run, wait_for

    run = tmp_path / "runs" / "chain"
    args = ("run_name=chain", "resume=auto", "train.max_steps=150", "train.log_every=5",
            "data.num_workers=0")
    outside, summaries = [], []
    for stop in ("mid-run", "start-up", None):
        began = time.monotonic()
        process = start_run(tiny, *args)
        if stop == "mid-run":
            metrics = run / "metrics.jsonl"
            wait_for(lambda: metrics.exists() and metrics.read_text().count('"train"') >= 3,
                     process)
        elif stop == "start-up":
            time.sleep(2.0)  # importing torch: before the first step
        if stop:
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=300)
        outside.append(time.monotonic() - began)
        assert process.returncode == (75 if stop else 0), err[-2000:]
        if stop == "start-up":
            assert "stopped during start-up" in err
        summaries.append(json.loads((run / "summary.json").read_text()))
    final = summaries[-1]
    starts = json.loads((run / "run.json").read_text())["starts"]
    assert final["status"] == "completed" and final["restarts"] == len(starts) - 1 == 2
    jobs = [s["job_seconds"] for s in summaries]
    assert [s["seconds"] for s in starts] == pytest.approx(jobs, abs=0.05)
    assert all(0 < job < whole for job, whole in zip(jobs, outside))
    assert final["wall_seconds"] == pytest.approx(sum(jobs), abs=0.05)  # none past, none lost
    assert final["device_hours"] == pytest.approx(final["wall_seconds"] / 3600)
    code, out, _ = run_cli("runs", "--json", "--db", str(tmp_path / "index.sqlite"))
    row, = [r for r in json.loads(out) if r["name"] == "chain"]
    assert row["wall_seconds"] == final["wall_seconds"]
    assert row["device_hours"] == final["device_hours"]


AUGMENTING = f"{Path(__file__).parent.parent / 'fixtures' / 'augmenting.py'}:augmenting"


@pytest.mark.parametrize("workers", [0, 2])
def test_the_seed_seeds_random_and_numpy_in_the_run_and_in_each_worker_per_epoch(
        tmp_path, tiny, run_cli, workers):
    """A dataset of your own that augments with `random` and `numpy.random`: two runs train
    the same weights (before, with 0 workers they differed: the training process's `random`
    and NumPy were never seeded), and a run stopped at an epoch's end and resumed trains the
    same weights too (before, with workers: the resumed run's fresh workers drew epoch 1's
    noise again)."""
    def train(name: str, *extra: str) -> Path:
        args = [o for o in tiny(f"run_name={name}", "train.epochs=2", "data.images.image_size=8",
                                f"data.num_workers={workers}", "data.persistent_workers=true",
                                "schedule.name=constant")  # the same LRs when stopped early
                if not o.startswith("data.shapes")] + [f"data.dataset={AUGMENTING}", *extra]
        code, _, err = run_cli("run", "default", *args)
        assert code == 0, err
        return tmp_path / "runs" / name

    first, second = final_weights(train("first")), final_weights(train("second"))
    assert all(torch.equal(first[k], v) for k, v in second.items())
    resumed = train("resumed", "train.max_steps=20")  # the end of epoch 1 (20 steps each)
    resumed = final_weights(train("resumed", "resume=auto"))
    assert all(torch.equal(first[k], v) for k, v in resumed.items())


