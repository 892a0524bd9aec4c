"""`hpctrain goodput` (issue 55, first part): a run's device-seconds by phase from run.json,
each job's seconds split as it ran and the steps a job killed without a word trained after
its last checkpoint counted from the records its resume forgot.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_goodput.py, tests/cluster/test_goodput.py."""

from __future__ import annotations

import json

import pytest

from hpctrain.runs.goodput import account
from hpctrain.config.training_settings import CheckpointConfig
from hpctrain.train.checkpoints.interval import (Pacer, daly_interval, expected_waste,
                                                 unwarned_stops)
PRIOR_STOP_HOURS = CheckpointConfig().prior_stop_hours  # the default: one a day


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


def test_the_dip_is_an_interval_s_time_beyond_its_steps_at_the_clean_median():
    from hpctrain.train.bookkeeping import Clock

    clock = Clock()
    clock.count_save_dip(3.0, 0.0, 10, 2)  # no clean interval yet: nothing to measure by
    for seconds in (1.2, 1.3, 1.1):  # 0.2 s of each a wait for data
        clock.count_save_dip(seconds, 0.2, 10, 0)
    clock.count_save_dip(1.7, 0.1, 10, 4)  # 1.6 s of computing where 1.0 was usual
    clock.count_save_dip(0.8, 0.0, 10, 1)  # faster than usual: no negative dip
    assert clock.save_dip_seconds == pytest.approx(0.6)
