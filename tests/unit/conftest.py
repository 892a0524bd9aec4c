"""The unit lane's promise, held: a test here starts no process, no server and no training
run, also through a fixture it asks for (a session's fixtures are set up before a test's
own, so the refusal spans the whole of each test's setup and call). Each is refused where it
would begin, naming the lane the test belongs in (tests/README.md)."""

from __future__ import annotations

import multiprocessing.process
import socket
import subprocess

import pytest

from hpctrain.train import loop

WHERE = "it belongs in tests/runs/ (a training run) or tests/cluster/ (processes, servers)"


def _refused(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a unit test {what}: {WHERE}")
    return refuse


def _guarded():
    guard = pytest.MonkeyPatch()
    guard.setattr(subprocess.Popen, "__init__", _refused("starts a process"))
    guard.setattr(multiprocessing.process.BaseProcess, "start", _refused("starts a process"))
    guard.setattr(socket.socket, "listen", _refused("starts a server"))
    guard.setattr(loop, "_train", _refused("trains"))
    return guard


def _refusing():
    guard = _guarded()
    try:
        return (yield)
    finally:
        guard.undo()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _refusing())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _refusing())
