"""`hpctrain goodput` (issue 55, first part): the tests that train, in this process or in an
`hpctrain` process of their own (the others are tests/unit/test_goodput.py,
tests/cluster/test_goodput.py)."""

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

FIXTURES = Path(__file__).parent.parent / "fixtures"
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
