"""The recipes' own long trainings (the README's promises: `hpctrain run` on the default,
`tiny-lm`, `pointnet`) start in the background as soon as the session has collected its
tests: one after another, in the order the tests need them, at the lowest CPU priority
(nice 19). They train in the time the rest of the suite leaves the cores idle (its waits on
Slurm, on hangs, on servers, pytest's one thread) instead of each in its turn.

A test asks for its run's result and waits for it, bounded. The run is the installed console
script with the arguments the test used to give it itself, so what each test proves is
unchanged; only the runs that a selected test asks for start."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

LONGEST = 1500  # seconds one recipe's training may take, however slow the machine


def installed_script() -> str:
    """The console script `hpctrain`, as a user runs it."""
    script = Path(sys.executable).with_name("hpctrain")
    return str(script) if script.exists() else "hpctrain"


@dataclass(frozen=True)
class RecipeRun:
    """One training in the background: hpctrain's arguments, given the folder it writes in."""
    fixture: str  # the fixture a test asks for it by
    arguments: Callable[[Path], list[str]]


@dataclass(frozen=True)
class Started:
    folder: Path  # its output, and its stdout, stderr and exit status once ended
    arguments: list[str]


class RecipeChain:
    """The runs a session's tests need, one after another in one shell of its own session."""

    def __init__(self, runs: Iterable[RecipeRun], items, folder_for: Callable[[str], Path]):
        first_use = {}
        for index, item in enumerate(items):
            for run in runs:
                if run.fixture in item.fixturenames:
                    first_use.setdefault(run.fixture, (index, run))
        self.started = {}
        for fixture, (_, run) in sorted(first_use.items(), key=lambda kv: kv[1][0]):
            folder = folder_for(fixture)
            self.started[fixture] = Started(folder, run.arguments(folder))
        self.process = self._start() if self.started else None

    def _start(self) -> subprocess.Popen:
        steps = []
        for run in self.started.values():
            folder = shlex.quote(str(run.folder))
            command = shlex.join([installed_script(), *run.arguments])
            steps.append(f"{command} >{folder}/stdout 2>{folder}/stderr\n"
                         f"echo $? >{folder}/status.partial && mv {folder}/status.partial "
                         f"{folder}/status")
        return subprocess.Popen(["nice", "-n", "19", "sh", "-c", "\n".join(steps)],
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def result(self, fixture: str) -> subprocess.CompletedProcess:
        """The run's ended process (its exit status, stdout and stderr), once it has ended."""
        run = self.started[fixture]
        status = run.folder / "status"
        bound = LONGEST * len(self.started) + 60  # its own, after those before it
        deadline = time.monotonic() + bound
        while not status.exists():
            if self.process.poll() is not None and not status.exists():
                raise AssertionError(f"the background trainings ended (exit "
                                     f"{self.process.returncode}) before {fixture}'s")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{fixture}'s training in the background has not ended "
                                     f"within {bound} s: {run.folder}")
            time.sleep(0.2)
        return subprocess.CompletedProcess(
            [installed_script(), *run.arguments], int(status.read_text()),
            (run.folder / "stdout").read_text(), (run.folder / "stderr").read_text())

    def stop(self) -> None:
        """A training still running when the session ends (its test failed first or was
        interrupted) or past its bound is stopped: the chain's group (the shell, the run and
        its loader workers) asked to end and, 10 s later, killed."""
        if self.process is None:
            return
        for sent in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sent)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _group_alive(self.process):
                time.sleep(0.1)
        self.process.wait(timeout=10)


def _group_alive(leader: subprocess.Popen) -> bool:
    leader.poll()  # the shell reaped, if it ended: its group may live on in the run
    try:
        os.killpg(leader.pid, 0)
        return True
    except ProcessLookupError:
        return False
