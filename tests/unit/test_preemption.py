"""Stopping in time: the tests that need no training run, no process and no server (the others
are tests/runs/test_preemption.py)."""

import os
import signal
import time

import pytest


from hpctrain.cluster.environment import detect
from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.parallel.processes import Distributed
from hpctrain.train.preemption import Stopper, deadline_at


def single() -> Distributed:
    return Distributed(detect({}), "none", hosts=("here",))


def test_a_signal_only_sets_a_flag_read_at_the_step_boundary():
    before = signal.getsignal(signal.SIGUSR1)
    stopper = Stopper(single())
    stopper.install("SIGUSR1")
    try:
        assert stopper.check() is None
        os.kill(os.getpid(), signal.SIGTERM)  # scancel: save and stop, no requeue
        assert stopper.check() == ("SIGTERM received", False)
        os.kill(os.getpid(), signal.SIGUSR1)  # the preemption notice: save, stop, requeue
        assert stopper.check() == ("SIGUSR1 received", True)
        os.kill(os.getpid(), signal.SIGTERM)  # a later SIGTERM does not cancel the requeue
        assert stopper.check() == ("SIGUSR1 received", True)
    finally:
        stopper.close()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_deadline_is_the_end_minus_the_margin():
    cfg = load_config("default", ["preemption.deadline=2026-11-22T18:00:00",
                                  "preemption.deadline_margin_seconds=600"]).preemption
    end = time.mktime((2026, 11, 22, 18, 0, 0, 0, 0, -1))
    assert deadline_at(cfg, None, now=end - 86400) == end - 600
    auto = load_config("default", []).preemption  # margin 300 s
    assert deadline_at(auto, 10000.0, now=0.0) == 9700.0
    assert deadline_at(auto, 1000.0, now=700.0) == 970.0  # a short job: a tenth as margin
    assert deadline_at(auto, None) is None
    assert load_config("default", ["preemption.deadline=1900000000"]).preemption.deadline == \
        1900000000.0
    with pytest.raises(ConfigError, match="preemption.deadline.*is not a time"):
        load_config("default", ["preemption.deadline=tomorrow"])


def test_signals_before_the_stopper_are_held_and_handed_over():
    from hpctrain.train.preemption import catch_early

    before = signal.getsignal(signal.SIGUSR2)
    catch_early(("SIGUSR2",))
    os.kill(os.getpid(), signal.SIGUSR2)  # would end the process, were it not held
    stopper = Stopper(single())
    stopper.install("SIGUSR2")
    try:
        assert stopper.check() == ("SIGUSR2 received", True)
    finally:
        stopper.close()
    assert signal.getsignal(signal.SIGUSR2) is before
