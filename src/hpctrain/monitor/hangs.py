"""A run that stops making progress is found, named and ended, so that its job goes on.

Each process of a run (every rank) keeps a watch: a thread that reads the process's progress
beats (beats.py) twice a second. A phase that outlasts its bound is a hang. The watch then
keeps every thread's stack of its process and of its loader workers in RUN_DIR/hang/
(rank-R.txt), writes where the process hangs as it sees it (rank-R.json: the innermost
frame, what it waits on, the worker it waits for), and rank 0 gathers every rank's view into
one line that names the hang (hang.json): the rank, the process (main or a loader worker),
the frame, and the cause where one is known (a fork deadlock, a collective waiting for rank
R, a read of a path). The run's own bookkeeping then records the hang (`on_hang`, given by the
training loop: run.json, summary.json, the requeue) and the process ends with the exit code it
returns (errors.ExitCode.HUNG: "requeue me"), its loader workers killed first.

Nothing in it waits without a bound: the gathering waits GATHER_SECONDS for the other ranks;
the whole handling is cut off after EXIT_WITHIN seconds by a timer that ends the process
anyway. Where the watch itself cannot run (a native call holding the interpreter for good),
faulthandler's own native timer, re-armed at every look, writes every thread's stack to
stderr and ends the process (exit 1) a minute after the bound.

Why not torch's NCCL watchdog alone: it sees only collectives, and only their timeout, not
which rank is late or where; a loader worker, a user hook or a save that never returns hangs
outside any collective.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import ExitCode
from hpctrain import process_clock
from hpctrain.monitor import stacks
from hpctrain.monitor.beats import CHECKPOINT, CLOSING, EVALUATION, STEP, Beats
from hpctrain.runs.directory import (CAPS, HANG_STACKS, HANG_VERDICT, HANG_VIEW, RunDir)
from hpctrain.readers import json_document
from hpctrain.writers import fresh_file, own_folder, write_whole

LOOK_SECONDS = 0.5  # between two looks at the beats
PROGRESS_SECONDS = 1.0  # rank 0's progress.json, rewritten this often (goodput's last beat)
GATHER_SECONDS = 20.0  # rank 0 waits this long for the other ranks' views
EXIT_WITHIN = 90.0  # the whole handling, after which the process ends regardless
NATIVE_SLACK = 60.0  # faulthandler's timer: the bound plus this, where the watch cannot run
WORKER_SECONDS = 30.0  # reading the loader workers' stacks, all together


@dataclass
class Hang:
    """What the watch found: the phase and step, how long without a beat, the bound, and
    the line that names it (composed by rank 0 from every rank's view)."""

    phase: str
    step: int | None
    silent: float
    bound: float
    line: str
    views: list[dict] = field(default_factory=list)


class HangWatch:
    """The watch of one process (see the module): `start()` it with the run, `place()` it
    when the run directory is known, `stop()` it when the run ends."""

    def __init__(self, settings, beats: Beats | None = None):
        self.settings = settings
        self.beats = beats or Beats()
        self.run_dir: Path | None = None
        self.rank, self.world_size = 0, 1
        self.on_hang: Callable[[Hang], int] = lambda hang: ExitCode.HUNG
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = process_clock.started_epoch()  # the job's start (place() says)

    def start(self) -> HangWatch:
        """The watch's thread; it also writes rank 0's progress.json, so it runs with
        monitor.hang_after=off too (which only ends its looking for hangs)."""
        self._thread = threading.Thread(target=self._run, name="hpctrain-hang-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def place(self, run_dir: Path, rank: int, world_size: int, began: float) -> None:
        """Where the stacks and progress go, which rank this process is of how many, and
        when its job began (Unix seconds)."""
        self.run_dir, self.rank, self.world_size = Path(run_dir), rank, world_size
        self._began = began

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            faulthandler.cancel_dump_traceback_later()

    def _run(self) -> None:
        written = 0.0
        while not self._stopping.wait(LOOK_SECONDS):
            if self.rank == 0 and self.run_dir is not None and \
                    time.monotonic() - written >= PROGRESS_SECONDS:
                self._write_progress()
                written = time.monotonic()
            bound = self.beats.bound(self.settings)
            silent = self.beats.silent()
            if bound is None:
                continue
            _arm_native(max(0.0, bound - silent) + NATIVE_SLACK)
            if silent > bound:
                self._hung(silent, bound)

    def _hung(self, silent: float, bound: float) -> None:
        """The hang: its stacks and views kept, its line composed, the run's bookkeeping,
        then the end of the process (never returns)."""
        faulthandler.cancel_dump_traceback_later()
        backstop = threading.Timer(EXIT_WITHIN, _end, (ExitCode.HUNG,))
        backstop.daemon = True
        backstop.start()
        phase, step, began = self.beats.phase, self.beats.step, time.time()
        setting = self.beats.bound_setting(self.settings)
        view = self._look(phase, step, silent, bound)
        views = self._gather(view, began)
        hang = Hang(phase, step, silent, bound, compose(views, phase, step, silent, bound,
                                                        self.world_size, setting), views)
        if self.rank == 0:
            self._write_verdict(hang)
            print(f"hpctrain: {hang.line}", file=sys.stderr, flush=True)
        try:
            code = self.on_hang(hang)
        except Exception as err:  # the bookkeeping failed: the hang still ends the process
            print(f"hpctrain: recording the hang failed: {type(err).__name__}: {err}",
                  file=sys.stderr, flush=True)
            code = ExitCode.HUNG
        _end(code)

    def _write_progress(self) -> None:
        """Rank 0's last beat where the next start of the run finds it: a job killed without
        a word is counted to it, and its steps redone to the last one it trained."""
        try:
            write_whole(RunDir(self.run_dir).progress, json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "began": self._began,
                 "time": time.time(), "step": self.beats.step, "phase": self.beats.phase}))
        except OSError:  # a full disk: the run says so where it writes its records
            pass

    # ---- this rank's view ------------------------------------------------------------------

    def _folder(self) -> Path | None:
        if self.run_dir is None:
            return None
        try:
            return own_folder(RunDir(self.run_dir).hang)
        except OSError:
            return None

    def _look(self, phase: str, step: int | None, silent: float, bound: float) -> dict:
        """This process's stacks (and its workers') into rank-R.txt; its view of where it
        hangs into rank-R.json; the view."""
        frames, innermost = stacks.main_stack()
        waited = stacks.waited_worker(innermost)
        del innermost
        view = {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                "time": time.time(), "phase": phase, "step": step, "where": stacks.place(frames),
                "waits_on": stacks.waiting_on(os.getpid(), threading.main_thread().native_id),
                "collective": in_collective(frames, self.world_size), "worker": None}
        folder = self._folder()
        handle = None
        if folder is not None:
            descriptor, draft = fresh_file(folder / HANG_STACKS.format(rank=self.rank))
            handle = os.fdopen(descriptor, "w")
            handle.write(f"rank {self.rank}, pid {os.getpid()} on {view['host']}: no progress "
                         f"for {silent:.1f} s in {phase} (bound {bound:.1f} s), step {step}\n\n")
            stacks.write_own_stacks(handle)
        else:  # before the run directory: stderr, the job's log
            try:
                stacks.write_own_stacks(sys.__stderr__)
            except (AttributeError, OSError, ValueError):  # no descriptor behind it
                pass
        deadline = time.monotonic() + WORKER_SECONDS
        for pid, started in _workers(first=waited):
            if time.monotonic() > deadline:
                break
            seen = stacks.worker_stacks(pid, started)
            if pid == waited:
                view["worker"] = {"pid": pid, "where": seen.where(), "tool": seen.tool}
            if handle is not None:
                handle.write(f"\n--- loader worker, pid {pid} ({seen.tool}"
                             f"{'' if seen.armed else ', never started its Python'}) ---\n"
                             f"{seen.text}")
        if handle is not None:
            handle.close()
            os.replace(draft, folder / HANG_STACKS.format(rank=self.rank))
            write_whole(folder / HANG_VIEW.format(rank=self.rank), json.dumps(view) + "\n")
        return view

    # ---- every rank's, by rank 0 -----------------------------------------------------------

    def _gather(self, view: dict, began: float) -> list[dict]:
        """Rank 0: every rank's view, as many as answer within GATHER_SECONDS (the others
        said as not answering). Another rank: its own, after waiting as long for rank 0's
        verdict (a launcher kills the group when the first process ends)."""
        folder = self._folder()
        if self.world_size == 1 or folder is None:
            return [view]
        deadline = time.monotonic() + GATHER_SECONDS
        if self.rank != 0:
            verdict = folder / HANG_VERDICT
            while time.monotonic() < deadline and _written_since(verdict, began) is None:
                time.sleep(0.2)
            return [view]
        views = {0: view}
        while time.monotonic() < deadline and len(views) < self.world_size:
            for rank in set(range(self.world_size)) - set(views):
                seen = _written_since(folder / HANG_VIEW.format(rank=rank), began)
                if seen is not None:
                    views[rank] = seen
            time.sleep(0.2)
        return [views.get(rank, {"rank": rank, "answered": False})
                for rank in range(self.world_size)]

    def _write_verdict(self, hang: Hang) -> None:
        folder = self._folder()
        if folder is None:
            return
        write_whole(folder / HANG_VERDICT, json.dumps(
            {"line": hang.line, "time": time.time(), "step": hang.step, "phase": hang.phase,
             "silent_seconds": hang.silent, "bound_seconds": hang.bound,
             "ranks": hang.views}, indent=1) + "\n")


def _arm_native(seconds: float) -> None:
    """faulthandler's native timer: every thread's stack to the process's stderr, and its
    end, in `seconds`, unless re-armed (where stderr has no file: not at all)."""
    try:
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__)
    except (AttributeError, OSError, RuntimeError, ValueError):  # no descriptor to write to
        pass


def _written_since(path: Path, began: float) -> dict | None:
    """A view or verdict written at this hang (not a former one's), else None."""
    value, why = json_document(path, CAPS[path.name if path.name == HANG_VERDICT
                                          else HANG_VIEW])
    if why is None and isinstance(value, dict) and isinstance(value.get("time"), (int, float)) \
            and value["time"] >= began - GATHER_SECONDS - EXIT_WITHIN:
        return value
    return None


def _workers(first: int | None) -> list[tuple[int, str | None]]:
    """This process's loader workers (its multiprocessing children), `first` first: (pid,
    how it was started: fork, forkserver, spawn)."""
    children = [(child.pid, _start_method(child)) for child in
                multiprocessing.active_children() if child.pid]
    return sorted(children, key=lambda child: child[0] != first)


def _start_method(child) -> str | None:
    """How multiprocessing started `child` (its Popen's module: popen_fork, ...)."""
    module = type(getattr(child, "_popen", None)).__module__.rsplit(".", 1)[-1]
    return {"popen_fork": "fork", "popen_forkserver": "forkserver",
            "popen_spawn_posix": "spawn"}.get(module)


COLLECTIVES = ("/torch/distributed/", "hpctrain/parallel/processes.py")


def in_collective(frames: list[stacks.Frame], world_size: int) -> bool:
    """Whether a rank waits in a collective: a torch.distributed call, hpctrain's own
    collectives, or the backward pass of several ranks (DDP's gradient all-reduce)."""
    if world_size == 1 or not frames:
        return False
    for frame in reversed(frames[-8:]):
        if any(marker in frame.file for marker in COLLECTIVES):
            return True
        if "/torch/autograd/" in frame.file or frame.function == "_engine_run_backward":
            return True
    return False


PHASE_WORDS = {STEP: "training step {next}", EVALUATION: "an evaluation batch (after step "
               "{step})", CHECKPOINT: "the checkpoint of step {step}", CLOSING: "the run's end"}


def compose(views: list[dict], phase: str, step: int | None, silent: float, bound: float,
            world_size: int, setting: str = "monitor.hang_after") -> str:
    """The one line that names a hang from every rank's view."""
    words = PHASE_WORDS.get(phase.split(":")[0], phase).format(
        step=step, next=None if step is None else step + 1)
    if phase.startswith(f"{CHECKPOINT}:"):
        words += f" ({phase.split(':', 1)[1].strip()})"
    head = f"hung in {words}: no progress for {silent:.0f} s (bound {bound:.0f} s, {setting})"
    if world_size == 1:
        return f"{head}; {_said(views[0])}"
    silent_ranks = [v["rank"] for v in views if v.get("answered") is False]
    late = [v for v in views if v.get("answered") is not False and not v.get("collective")]
    waiting = [v["rank"] for v in views if v.get("collective")]
    parts = [f"rank {v['rank']} {_said(v)}" for v in late]
    if waiting:
        whom = f"rank {late[0]['rank']}" if len(late) == 1 else \
            "the ranks above" if late else "a rank that never came"
        first = next(v for v in views if v.get("collective"))
        parts.append(f"{_ranks(waiting)} wait{'s' if len(waiting) == 1 else ''} for {whom} "
                     f"in a collective ({first.get('where')})")
    if silent_ranks:
        parts.append(f"{_ranks(silent_ranks)} did not answer (no shared run directory, or "
                     "its watch could not run: its stacks are in its stderr)")
    return f"{head}; " + "; ".join(parts)


def _ranks(numbers: list[int]) -> str:
    return ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(map(str, numbers))


def _said(view: dict) -> str:
    """One process's view in words."""
    worker = view.get("worker")
    if worker is not None:
        return f"waits for its loader worker (pid {worker['pid']}), which hangs: " \
               f"{worker['where']}"
    waits = f", {view['waits_on']}" if view.get("waits_on") else ""
    return f"hangs in {view.get('where')}{waits}"


def _end(code: int) -> None:
    """End this process now: its loader workers killed, its output flushed."""
    for child in multiprocessing.active_children():
        try:
            child.kill()
        except (OSError, AttributeError):
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(int(code))
