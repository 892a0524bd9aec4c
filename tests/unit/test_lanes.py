"""The unit lane refuses what would make it slow (tests/README.md): a process, a server, a
training run; each refusal names the lane the test belongs in."""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys

import pytest


def test_a_process_a_server_and_a_training_run_are_refused_here():
    from hpctrain.train import loop

    with pytest.raises(AssertionError, match="starts a process: it belongs in tests/runs/"):
        subprocess.run([sys.executable, "-c", "pass"])
    with pytest.raises(AssertionError, match="starts a process"):
        multiprocessing.get_context("spawn").Process(target=print).start()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        with pytest.raises(AssertionError, match="starts a server"):
            server.listen()
    with pytest.raises(AssertionError, match="trains"):
        loop._train(None, None, None)
