"""`hpctrain goodput` (issue 55, first part): a run's device-seconds by phase from run.json,
each job's seconds split as it ran and the steps a job killed without a word trained after
its last checkpoint counted from the records its resume forgot."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpctrain.runs.goodput import PHASES, account
from hpctrain.config.training_settings import CheckpointConfig
from hpctrain.train.checkpoints.interval import (Pacer, daly_interval, expected_waste,
                                                 unwarned_stops)

FIXTURES = Path(__file__).parent / "fixtures"
PRIOR_STOP_HOURS = CheckpointConfig().prior_stop_hours  # the default: one a day


def test_a_run_s_account_adds_up_job_by_job(tmp_path):
    """Two jobs of two devices: the first killed after its last record (5 of its 100 steps
    redone: the second start adds them to its seconds), the second ended; 3 s between
    them."""
    from hpctrain.runs.identity import record_start

    split = {"startup": 2.0, "training": 10.0, "data_wait": 1.0, "evaluation": 1.5,
             "checkpoint": 0.5, "steps": 100}
    first = {"time": 100.0, "claimed": 100.0, "restart": 0, "launcher": "torchrun",
             "world_size": 2, "hosts": ["n1"], "output_dir": str(tmp_path), "seconds": 15.0,
             "device_hours": 15.0 * 2 / 3600, "split": split}
    record_start(tmp_path, {}, first)
    record = record_start(tmp_path, {}, {**first, "claimed": 118.5, "time": 118.5,
                                         "redone_steps": 5, "seconds": 20.0,
                                         "split": {**split, "training": 14.0}})
    assert record["starts"][0]["seconds"] == 15.5  # its 5 steps after the record, 0.1 s each
    assert record["starts"][0]["device_hours"] == pytest.approx(15.5 * 2 / 3600)
    made = account(record)
    assert made.jobs == 2 and made.redone_steps == 5 and made.between_jobs == 3.0
    assert made.phases["lost_work"] == 5 * 10.0 / 100 * 2  # the first job's step time
    assert made.allocated == (15.5 + 20.0) * 2
    assert made.phases["productive"] == (9.0 + 13.0) * 2
    assert made.phases["other"] == (1.0 + 2.0) * 2  # 15.5 - 14.5, 20 - 18
    assert sum(made.phases.values()) == pytest.approx(made.allocated)
    assert made.goodput == pytest.approx(44.0 / 71.0)
    older = account({"starts": [{"claimed": 0.0}, {"claimed": 1.0, "seconds": 2.0}]})
    assert older.unaccounted_jobs == 1 and older.allocated == 2.0


def test_a_redone_estimate_never_takes_a_job_past_its_seconds():
    """The redone seconds are steps at a median step time: a job counted to its last beat
    (killed without a word) may have had a little less time after its split than they
    come to, and a hung one less training; the lost work is then what the job had, and
    its phases add up to its seconds (CI once saw 15.0148 device-seconds of a 15 s
    allocation)."""
    split = {"startup": 2.0, "training": 10.0, "checkpoint": 0.5, "steps": 100}
    lost = {"claimed": 0.0, "seconds": 13.0, "lost": True, "split": split,
            "redone_seconds": 0.52}
    made = account({"starts": [lost]})
    assert made.phases["lost_work"] == pytest.approx(0.5)  # 13 - 12.5, not the 0.52
    assert made.phases["other"] == 0.0
    assert sum(made.phases.values()) == pytest.approx(made.allocated) == 13.0
    hung = {"claimed": 0.0, "seconds": 20.0, "hung": "step", "redone_seconds": 12.0,
            "split": {**split, "hung": 6.0}}
    made = account({"starts": [hung]})
    assert made.phases["lost_work"] == 10.0 and made.phases["productive"] == 0.0
    assert sum(made.phases.values()) == pytest.approx(20.0)
    waited = account({"starts": [{**hung, "redone_seconds": 4.0,
                                  "split": {**hung["split"], "data_wait": 2.0}}]})
    assert waited.phases["lost_work"] == 4.0  # of its 10 s of training, 2 s waiting
    assert waited.phases["productive"] == pytest.approx(8.0 * 0.6)
    assert waited.phases["data_wait"] == pytest.approx(2.0 * 0.6)
    assert sum(waited.phases.values()) == pytest.approx(20.0)


def test_the_records_a_resume_forgets_tell_when_the_job_before_was_last_alive(tmp_path):
    """A job killed without a word beat every second; the records it wrote after its last
    beat are later evidence that it lived (under load, the redone steps came to 0.94 s where
    its beats left it 0.61 s after its split): the last one's time is handed to its account."""
    from hpctrain.train.telemetry import forget_lost_records

    metrics = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "step": step, "time": 100.0 + step, "seconds_per_step": 0.5}
            for step in range(1, 6)] + [{"kind": "gpu", "step": 5, "time": 105.5}]
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert forget_lost_records(metrics, 2, None) == (3, 1.5, 105.5)
    assert forget_lost_records(metrics, 2, None) == (0, 0.0, None)  # forgotten already


KILLED = textwrap.dedent("""
    import signal, sys
    sys.path.insert(0, {fixtures!r})
    import hpctrain
    from lit_classifier import LitClassifier, StopAt, blobs

    train, val = blobs()
    hpctrain.fit(LitClassifier(), StopAt(train, int(sys.argv[2]), signal.SIGKILL), val,
                 output_dir=sys.argv[1], run_name="run", tensorboard=False, report=False,
                 train={{"epochs": 3, "batch_size": 16, "log_every": 1}},
                 checkpoint={{"every_steps": 20}}, data={{"num_workers": 0}})
""")


def test_a_job_killed_without_a_word_is_accounted_with_the_steps_it_trained_again(
        tmp_path, run_cli, capsys):
    """A job SIGKILLed during its step 34 (its checkpoint at step 20, its records to step
    33) and the run resumed: run.json counts both jobs, each with its seconds by phase, and
    the resume's 13 steps redone, at its records' median step time; `hpctrain goodput` adds
    them up to the allocated device-seconds, the killed job's lost steps beyond its recorded
    seconds."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED.format(fixtures=str(FIXTURES)))
    checks = 3  # the samples the checks before training read (the first, middle and last)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), str(
        checks + 33 * 16 + 5)], capture_output=True, text=True, timeout=240)
    assert done.returncode == -9, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]  # the killed job's, before the resume forgets those after 20
    took = {r["step"]: r["seconds_per_step"] for r in records if r["kind"] == "train"}
    sys.path.insert(0, str(FIXTURES))
    from lit_classifier import LitClassifier, blobs

    import hpctrain

    summary = hpctrain.fit(LitClassifier(), *blobs(), output_dir=str(tmp_path),
                           run_name="run", resume="auto", tensorboard=False, report=False,
                           train={"epochs": 3, "batch_size": 16, "log_every": 1},
                           checkpoint={"every": "auto"}, data={"num_workers": 0})
    assert summary["restarts"] == 1 and summary["steps"] == 96
    chosen = summary["checkpoint_interval"]  # from the killed job: one stop without a word
    assert chosen["unwarned_stops"] == 1 and chosen["save_seconds"] > 0
    assert chosen["mtbf_hours"] == pytest.approx((chosen["run_hours"] + PRIOR_STOP_HOURS) / 2)
    assert "checkpoint.every=auto: the first save after 600 s" in capsys.readouterr().out
    starts = json.loads((Path(summary["run_dir"]) / "run.json").read_text())["starts"]
    assert [start.get("redone_steps") for start in starts] == [0, 13]
    assert [start["split"]["steps"] for start in starts] == [20, 76]  # to its last record
    code, out, err = run_cli("goodput", summary["run_dir"], "--json")
    assert code == 0, err
    made = json.loads(out)
    killed, resumed = starts
    # the 13 steps at the median step time of the killed job's records forgotten
    assert killed["redone_seconds"] == pytest.approx(
        13 * statistics.median(took[s] for s in range(21, 34)))
    assert made["device_seconds"]["lost_work"] == killed["redone_seconds"]
    assert made["allocated_device_seconds"] == pytest.approx(
        killed["seconds"] + resumed["seconds"])  # the killed one's with its redone steps
    # and the resumed one's end after its summary (the trackers' close): a little more
    assert 0 <= made["allocated_device_seconds"] - summary["device_hours"] * 3600 < 0.5
    assert sum(made["device_seconds"].values()) == pytest.approx(
        made["allocated_device_seconds"])
    assert set(made["device_seconds"]) == set(PHASES) and 0 < made["goodput"] < 1
    # the summary's, the same figure as of the summary (the job's last second after it)
    assert summary["goodput"] == pytest.approx(made["goodput"], rel=1e-3)
    code, out, _ = run_cli("goodput", summary["run_dir"])
    assert code == 0 and "work lost to stops (steps redone)" in out
    assert "13 steps redone after stops" in out


def test_the_checkpoint_interval_that_wastes_least_is_daly_s():
    """Young's sqrt(2 * save * mtbf) for small saves, Daly's correction above it, and its
    bounds: never shorter than a save, the mean time between stops for saves of half of it;
    at its interval the first-order waste is no more than at half or twice it
    (benchmarks/checkpoint_interval.py simulates the stops)."""
    young = (2 * 1.0 * 3600) ** 0.5
    assert daly_interval(1.0, 3600) == pytest.approx(young, rel=0.02)
    assert daly_interval(30.0, 3600) == pytest.approx(445.0, abs=0.1)
    assert daly_interval(2000.0, 3600) == 3600  # Daly's bound
    best = daly_interval(30.0, 3600)
    assert expected_waste(best, 30, 3600) <= min(expected_waste(best / 2, 30, 3600),
                                                  expected_waste(best * 2, 30, 3600))
    with pytest.raises(ValueError):
        daly_interval(0.0, 3600)


def test_checkpoint_every_auto_paces_the_saves_from_what_it_measures():
    """Before a save is measured: at the epoch's end (or after 600 s of training); then
    Daly's interval for the slowest rank's save and the run's stops, in steps of the slowest
    rank's step time, never beyond the job's time left; the stops counted from run.json."""
    starts = [{"seconds": 3600.0}, {"seconds": 1800.0, "redone_steps": 7},
              {"seconds": 900.0, "lost": "died without a word"}, {"seconds": 100.0}]
    assert unwarned_stops(starts) == (2, 6400 / 3600)
    assert unwarned_stops(starts, now=True)[0] == 3  # this start took a dead job's lock over
    pacer = Pacer(stops=2, hours=1.75, steps_per_epoch=50, prior_hours=PRIOR_STOP_HOURS)
    assert pacer.mtbf_seconds == 3600 * (1.75 + PRIOR_STOP_HOURS) / 3
    assert [step for step in range(1, 120) if pacer.saves(step)] == [50, 100]
    pacer.update(step_seconds=0.5, save_seconds=None)  # no save yet: 600 s of training
    assert pacer.interval == 1200
    pacer.update(step_seconds=0.5, save_seconds=30.0)
    assert pacer.interval == round(daly_interval(30.0, pacer.mtbf_seconds) / 0.5)
    assert not pacer.saves(100 + pacer.interval - 1)  # from the last save, at step 100
    assert pacer.saves(100 + pacer.interval)
    short = Pacer(stops=0, hours=0.0, steps_per_epoch=50, prior_hours=0.5, limit=120.0)
    short.update(step_seconds=1.0, save_seconds=30.0)
    assert short.interval == 120 and short.describe()["seconds"] == 120.0


@pytest.mark.distributed
def test_two_processes_pace_their_saves_alike(tiny, tmp_path):
    """checkpoint.every=auto under two torchrun processes on gloo: a save is collective, so
    both must choose the same steps; they do, from figures gathered from both: the first
    save at the first epoch's end, the next (the measured save's Daly interval being far
    longer than the run) at its last step."""
    import os

    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "hpctrain", "run", "default",
         *tiny("run_name=paced", "train.global_batch_size=32", "train.epochs=3",
               "checkpoint.every=auto", "preemption.deadline=null")],
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "paced"
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == [
        "step_00000005", "step_00000015"]
    chosen = json.loads((run / "summary.json").read_text())["checkpoint_interval"]
    assert chosen["save_seconds"] > 0 and chosen["steps"] > 15


def test_what_goodput_and_the_auto_interval_cannot_take_is_one_line(tmp_path, run_cli):
    """A folder that is no run, a job id hpctrain never submitted, checkpoint.every=auto beside
    every_steps, a prior of no hours: exit 2, each said."""
    code, _, err = run_cli("goodput", str(tmp_path))
    assert code == 2 and f"{tmp_path}: no run.json: not a run directory of hpctrain" in err
    code, _, err = run_cli("run", "default", "checkpoint.every=auto",
                           "checkpoint.every_steps=5")
    assert code == 2 and "checkpoint.every=auto chooses the interval: leave " \
        "checkpoint.every_steps out" in err
    code, _, err = run_cli("run", "default", "checkpoint.prior_stop_hours=0")
    assert code == 2 and "checkpoint.prior_stop_hours = 0: Input should be greater than 0" \
        in err  # the configuration's own form: its header, one line per field
    code, _, err = run_cli("goodput", "424242")  # a job id hpctrain never submitted here
    assert code == 2 and "job 424242: not one that hpctrain submitted" in err
    assert len(err.strip().splitlines()) == 1


def test_the_account_takes_the_allocated_seconds_from_the_scheduler_where_it_has_them():
    """Job 7 ran twice (Slurm requeued it), job 9 continued it on 4 GPUs with 2 processes,
    and ran once more without reaching hpctrain (cancelled in its script). The scheduler's
    seconds are allocated; what the run's records do not cover is `unrecorded`; the gaps
    between jobs are the scheduler's; a job whose processes outlived the scheduler's end (a
    cancel's grace) counts its own longer time."""
    split = {"startup": 2.0, "training": 10.0, "data_wait": 1.0, "evaluation": 1.5,
             "checkpoint": 0.5, "steps": 100}
    record = {"starts": [
        {"job_id": "7", "claimed": 102.5, "seconds": 20.0, "world_size": 1, "split": split},
        {"job_id": "7", "claimed": 200.2, "seconds": 30.0, "world_size": 1, "split": split},
        {"job_id": "9", "claimed": 300.0, "seconds": 15.0, "world_size": 2, "split": split}]}
    held = [{"id": "7", "start": 100.0, "end": 123.0, "devices": None},
            {"id": "7", "start": 198.0, "end": 230.0, "devices": None},
            {"id": "9", "start": 299.0, "end": 309.0, "devices": 4},
            {"id": "9", "start": 400.0, "end": 405.0, "devices": 4}]
    made = account(record, held)
    assert made.jobs == 4 and made.source == "the scheduler's accounting"
    assert made.scheduler == 23 + 32 + 10 * 4 + 5 * 4
    assert made.recorded == 20 + 30 + 15 * 2
    assert made.allocated == 23 + 32 + 40 + 20  # job 9: 4 GPUs x 10 s > 2 processes x 15 s
    assert made.phases["unrecorded"] == 3 + 2 + (40 - 30) + 20
    assert sum(made.phases.values()) == pytest.approx(made.allocated)
    assert made.between_jobs == (198 - 123) + (299 - 230) + (400 - 309)
    assert made.phases["productive"] == 9.0 * (1 + 1 + 2)
    outlived = account({"starts": [{"job_id": "5", "claimed": 10.0, "seconds": 9.0}]},
                       [{"id": "5", "start": 10.0, "end": 16.0, "devices": None}])
    assert outlived.allocated == 9.0 and outlived.phases["unrecorded"] == 0.0
    running = account({"starts": []}, [{"id": "3", "start": 10.0, "end": None,
                                        "devices": 1}], now=25.0)
    assert running.allocated == 15.0 == running.phases["unrecorded"]


def test_a_save_writing_behind_the_steps_is_counted_apart_from_its_stall(tmp_path, run_cli,
                                                                        tiny, monkeypatch):
    """async_save: the save's blocking part is `checkpoint`, and the steps it slows while it
    writes behind them (here a writer that also keeps the CPU busy for 0.6 s, as a large
    save's copies and writes do) are `save_dip`, measured against the intervals without a
    save; productive is what is left of the training time."""
    import concurrent.futures
    import threading
    import time

    import torch.distributed.checkpoint as dcp

    real = dcp.async_save

    def busy_save(*args, **kwargs):
        inner, done = real(*args, **kwargs), concurrent.futures.Future()

        def write():
            end = time.monotonic() + 0.6
            while time.monotonic() < end:
                sum(range(2000))
            inner.result()
            done.set_result(None)
        threading.Thread(target=write, daemon=True).start()
        return done
    monkeypatch.setattr(dcp, "async_save", busy_save)
    code, _, err = run_cli("run", "default", *tiny(
        "run_name=dip", "train.max_steps=80", "train.log_every=2", "checkpoint.every_steps=30",
        "checkpoint.async_save=true", "train.eval_every_epochs=100"))
    assert code == 0, err
    run = tmp_path / "runs" / "dip"
    (start,) = json.loads((run / "run.json").read_text())["starts"]
    split = start["split"]
    assert 0 < split["save_dip"] < split["training"] - split["data_wait"]
    code, out, _ = run_cli("goodput", str(run), "--json")
    made = json.loads(out)
    assert made["device_seconds"]["save_dip"] == pytest.approx(split["save_dip"])
    assert made["device_seconds"]["productive"] == pytest.approx(
        split["training"] - split["data_wait"] - split["save_dip"])
    assert sum(made["device_seconds"].values()) == pytest.approx(
        made["allocated_device_seconds"])


def test_the_dip_is_an_interval_s_time_beyond_its_steps_at_the_clean_median():
    from hpctrain.train.bookkeeping import Clock

    clock = Clock()
    clock.count_save_dip(3.0, 0.0, 10, 2)  # no clean interval yet: nothing to measure by
    for seconds in (1.2, 1.3, 1.1):  # 0.2 s of each a wait for data
        clock.count_save_dip(seconds, 0.2, 10, 0)
    clock.count_save_dip(1.7, 0.1, 10, 4)  # 1.6 s of computing where 1.0 was usual
    clock.count_save_dip(0.8, 0.0, 10, 1)  # faster than usual: no negative dip
    assert clock.save_dip_seconds == pytest.approx(0.6)


def _lived(command: list[str], until=None, then=None, stuck_at: int = 10 ** 9) \
        -> tuple[int, float]:
    """Run `command`; (its exit code, its wall seconds measured from here). `until(pid)`
    polled every 20 ms: once true, `then` (a signal) is sent to it. `stuck_at`: the call of
    the hangs fixture's metric that never returns."""
    import os
    import time

    began = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "HANGS_STUCK_AT": str(stuck_at)})
    if until is not None:
        while child.poll() is None and not until(child.pid):
            time.sleep(0.02)
        os.kill(child.pid, then)
    _, err = child.communicate(timeout=300)
    assert child.returncode != 70, err[-3000:]  # never an internal error
    return child.returncode, time.perf_counter() - began


def _redone(run: Path, saved: int, trained: int | None = None) -> tuple[int, float]:
    """(the steps a job trained after its checkpoint at `saved`, to `trained` or its last
    record, and their median step time), from its records before the next start forgets
    them."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    after = [r for r in records if r["kind"] == "train" and r["step"] > saved]
    trained = after[-1]["step"] if trained is None else trained
    return trained - saved, statistics.median(r["seconds_per_step"] for r in after)


def _trained(run: Path) -> int:
    """The last training record's step (log_every=1: the last step trained, give or take)."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [json.loads(line)["step"] for line in lines[:-1] if '"kind": "train"' in line]
    return steps[-1] if steps else 0


@pytest.mark.slow
def test_every_second_of_a_chain_of_stops_is_counted(tmp_path):
    """A run killed with SIGKILL before its first checkpoint, stopped by SIGTERM, killed
    during its next start-up (after it claimed the run), hung, and finished: the allocated
    seconds of `hpctrain goodput` are the processes' wall times measured from outside, and
    its lost work the steps known to be done again at their step time (issue 65: before,
    0.09 to 0.92 of the wall time, a job killed before its first checkpoint 0.0004 s)."""
    import signal

    sys.path.insert(0, str(FIXTURES))
    from hangs import recipe

    run = tmp_path / "runs" / "chain"
    base = [sys.executable, "-m", "hpctrain", "run", str(recipe(tmp_path, metric=True)),
            "run_name=chain",
            "resume=auto", "train.max_steps=1000", "train.log_every=1",
            "checkpoint.every_steps=250", "data.kwargs.delay=0.0004", "data.kwargs.count=4096",
            "monitor.hang_startup_seconds=60"]
    holder = lambda pid: (run / "run.lock").exists() and f'"pid": {pid},' in \
        (run / "run.lock").read_text()
    walls, lost = [], []  # each job's seconds from outside; (steps redone, their step time)
    code, wall = _lived(base, lambda pid: _trained(run) >= 200, signal.SIGKILL)
    walls.append(wall)
    lost.append(_redone(run, 0))  # no checkpoint yet: every step it trained
    code, wall = _lived(base, lambda pid: _trained(run) >= 400, signal.SIGTERM)
    assert code == 75
    walls.append(wall)
    code, wall = _lived(base, holder, signal.SIGKILL)  # claimed the run, never trained
    walls.append(wall)
    code, wall = _lived([*base, "monitor.hang_after=2"], stuck_at=150)
    assert code == 76
    walls.append(wall)
    hung_at = json.loads((run / "hang" / "hang.json").read_text())["step"]
    lost.append(_redone(run, max(s for s in (250, 500, 750) if s <= hung_at), hung_at))
    code, wall = _lived(base)
    assert code == 0
    walls.append(wall)
    record = json.loads((run / "run.json").read_text())
    made = account(record)
    assert made.jobs == 5
    print(f"allocated {made.allocated:.2f} s, wall time from outside {sum(walls):.2f} s "
          f"({made.allocated / sum(walls):.3f}); lost work {made.phases['lost_work']:.3f} s")
    assert made.allocated == pytest.approx(sum(walls), rel=0.05), (made.allocated, walls)
    assert made.redone_steps == pytest.approx(sum(steps for steps, _ in lost), abs=2)
    assert made.phases["lost_work"] == pytest.approx(
        sum(steps * each for steps, each in lost), rel=0.05)
