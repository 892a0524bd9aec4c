"""A run that stops making progress is found, named and ended with the exit code that asks for
a requeue (issue 65): the tests that need no training run, no process and no server (the
others are tests/runs/test_hangs.py, tests/cluster/test_hangs.py)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from hpctrain.errors import ExitCode
from hpctrain.monitor import beats as beats_module
from hpctrain.monitor import stacks
from hpctrain.monitor.beats import Beats
from hpctrain.monitor.hangs import compose
from hpctrain.config.operation_settings import MonitorConfig

FIXTURES = Path(__file__).parent.parent / "fixtures"
sys.path.insert(0, str(FIXTURES))


# ---- the bound, the line, the stacks: no run ------------------------------------------------

def _lengths(beats: Beats, monkeypatch, phase: str, lengths: list[float]) -> None:
    """Beat `phase` len(lengths) times, each lasting its length (a clock of our own)."""
    now = [beats.since]
    monkeypatch.setattr(beats_module.time, "monotonic", lambda: now[0])
    beats.beat(phase)
    for length in lengths:
        now[0] += length
        beats.beat(phase)


def test_a_phase_is_bound_by_start_up_first_then_by_its_own_median(monkeypatch):
    auto = MonitorConfig(hang_floor_seconds=30, hang_startup_seconds=900)
    beats = Beats()
    assert beats.bound(auto) == 900  # start-up
    _lengths(beats, monkeypatch, "step", [])
    assert beats.bound(auto) == 900  # the first step compiles: start-up's bound
    _lengths(beats, monkeypatch, "step", [0.5, 4.0, 0.5])
    assert beats.bound(auto) == 30  # 20 x 0.5 s is under the floor
    _lengths(beats, monkeypatch, "step", [3.0] * 9)
    assert beats.bound(auto) == 60  # 20 x the median 3 s
    assert "20 times its median" in beats.bound_setting(auto)
    assert beats.bound(MonitorConfig(hang_after=7)) == 7
    assert beats.bound(MonitorConfig(hang_after="off")) is None
    beats.beat("evaluation")
    assert beats.bound(MonitorConfig(hang_after=7, hang_startup_seconds=50)) == 50


def test_a_bound_that_is_no_duration_is_refused(run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny("monitor.hang_after=0"))
    assert code == ExitCode.BAD_INPUT and "monitor.hang_after" in err and "above 0" in err


def test_the_line_names_the_late_rank_and_those_waiting_for_it():
    waiting = {"rank": 0, "collective": True, "where": "torch code at torch/autograd/graph.py"
               ":1072 in _engine_run_backward"}
    late = {"rank": 1, "collective": False, "where": "your code at /x/net.py:12 in forward",
            "waits_on": "waiting on a lock"}
    line = compose([waiting, late, {"rank": 2, "answered": False}, dict(waiting, rank=3)],
                   "step", 6, 31.2, 30, 4)  # 6 steps trained: the 7th hangs
    assert line.startswith("hung in training step 7: no progress for 31 s (bound 30 s")
    assert "rank 1 hangs in your code at /x/net.py:12 in forward, waiting on a lock" in line
    assert "ranks 0, 3 wait for rank 1 in a collective (torch code at" in line
    assert "rank 2 did not answer" in line
    worker = {"rank": 0, "worker": {"pid": 9, "where": "your code at d.py:3 in __getitem__, "
                                                       "reading /nfs/x"}}
    assert compose([worker], "evaluation", 16, 5, 4, 1).endswith(
        "waits for its loader worker (pid 9), which hangs: your code at d.py:3 in "
        "__getitem__, reading /nfs/x")


def test_whose_code_a_frame_is():
    assert stacks.owner_of(threading.__file__) == "python"
    assert stacks.owner_of(stacks.__file__) == "hpctrain"
    assert stacks.owner_of(pytest.__file__) == "library"
    assert stacks.owner_of(__file__) == "yours"
    frames = [stacks.Frame(__file__, 3, "hook"), stacks.Frame(threading.__file__, 9, "wait")]
    assert stacks.place(frames) == f"your code at {__file__}:3 in hook (python at " \
                                   "threading.py:9 in wait)"


# ---- every wait bounded, every child ending with its starter -------------------------------

def test_a_tracker_that_does_not_close_is_said_and_left_behind(tmp_path, monkeypatch, capsys):
    from hpctrain.train import telemetry

    class Stuck:
        def finish(self, summary, files):
            threading.Event().wait()

    closed = []

    class Fine:
        def finish(self, summary, files):
            closed.append(summary)

    monkeypatch.setattr(telemetry, "CLOSE_SECONDS", 0.3)
    writer = telemetry.Telemetry(tmp_path, 10, 0, enabled=True)
    writer.add_sinks([Stuck(), Fine()])
    began = time.monotonic()
    writer.finish({"status": "interrupted"}, [])
    writer.close()
    assert time.monotonic() - began < 5 and closed == [{"status": "interrupted"}]
    assert "stuck did not close within 0 s; its last figures may be missing there, " \
           "metrics.jsonl has them all" in capsys.readouterr().err


def test_the_bound_from_a_verb_to_the_process_end_is_15_s_or_the_environments(monkeypatch,
                                                                               capsys):
    from hpctrain import console

    monkeypatch.delenv("HPCTRAIN_EXIT_SECONDS", raising=False)
    assert console._exit_seconds() == 15
    monkeypatch.setenv("HPCTRAIN_EXIT_SECONDS", "2.5")
    assert console._exit_seconds() == 2.5
    for bad in ("soon", "0", "-1", "inf", "nan"):
        monkeypatch.setenv("HPCTRAIN_EXIT_SECONDS", bad)
        assert console._exit_seconds() is None
        assert capsys.readouterr().err == (
            f"hpctrain: HPCTRAIN_EXIT_SECONDS='{bad}' is not a finite positive number of "
            "seconds; unset it for the default, 15\n")
