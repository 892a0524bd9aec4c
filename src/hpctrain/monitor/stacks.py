"""Where a process hangs: every thread's stack of this process and of its loader workers, and
the one place that names the hang.

This process's stacks come from faulthandler, which reads them without the interpreter's
help (a thread stuck in native code is shown too). A worker's come from py-spy (`pip install
py-spy`), which reads them from outside; where it may not attach (ptrace forbidden, not
installed), from the faulthandler each worker arms as it starts (`arm_in_worker`: it writes
its stacks on SIGQUIT into an anonymous memory file this process reads through /proc). A
worker that never armed it never ran its first line of Python after its fork: it is stuck in
the fork itself (CPython gh-112275: an interpreter lock held by another thread at the fork,
fixed in 3.12, present in 3.11.7).

The place named is the innermost frame of the thread that stopped making progress: your own
code's where any frame is yours, else the library's; and what it waits on where /proc tells
(a read names its file, a lock, a child), or what the frames say (a collective, a loader's
next batch from worker N).
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hpctrain.commands import run_command
from hpctrain.readers import read_text_capped

DUMP_SIGNAL = signal.SIGQUIT  # a worker writes its stacks on it (armed at its start)
DUMP_CAP = 4 << 20  # of a worker's faulthandler dump: every thread's stack, some KB
MEMORY_FILE = "hpctrain-stacks"  # the worker's anonymous file for them
PY_SPY_SECONDS = 15.0
_PR_SET_PTRACER = 0x59616D61  # Yama: which process may trace this one
# system calls a blocked thread sits in, by number (x86_64, aarch64): what it waits on
_CALLS = {"x86_64": {0: "read", 17: "read", 19: "read", 257: "open", 202: "lock",
                     61: "child", 7: "poll", 232: "poll", 23: "poll", 45: "socket"},
          "aarch64": {63: "read", 67: "read", 65: "read", 56: "open", 98: "lock",
                      260: "child", 73: "poll", 22: "poll", 207: "socket"}}


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def owner(self) -> str:
        return owner_of(self.file)

    def __str__(self) -> str:
        return f"{_short(self.file)}:{self.line} in {self.function}"


def _roots() -> dict[str, tuple[str, ...]]:
    paths = sysconfig.get_paths()
    libraries = tuple({paths["purelib"], paths["platlib"]})
    return {"hpctrain": (str(Path(__file__).resolve().parents[1]),),
            "library": libraries + tuple(p for p in sys.path if "-packages" in p),
            "python": (paths["stdlib"], paths["platstdlib"])}


_ROOTS: dict[str, tuple[str, ...]] | None = None


def owner_of(file: str) -> str:
    """Whose code a file is: hpctrain, torch, library (another installed package), python
    (the standard library), yours (anything else: your model, dataset, hooks)."""
    global _ROOTS
    _ROOTS = _ROOTS or _roots()
    if file.startswith("<"):
        return "python"
    if file.startswith(_ROOTS["hpctrain"]):
        return "hpctrain"
    if file.startswith(_ROOTS["library"]):
        return "torch" if "/torch/" in file else "library"
    if file.startswith(_ROOTS["python"]):
        return "python"
    return "yours"


def _short(file: str) -> str:
    """A file as people read it: inside a package from the package on, the standard
    library's by its name, yours as it is."""
    global _ROOTS
    _ROOTS = _ROOTS or _roots()
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in file:
            return file.split(marker, 1)[1]
    if file.startswith(_ROOTS["hpctrain"]):
        return "hpctrain" + file[len(_ROOTS["hpctrain"][0]):]
    for root in _ROOTS["python"]:
        if file.startswith(root + "/"):
            return file[len(root) + 1:]
    return file


def place(frames: list[Frame]) -> str:
    """The place a stack (outermost first) hangs: the innermost frame of your own code where
    there is one, with the library's innermost beside it; else the innermost."""
    if not frames:
        return "no Python frame"
    inner = frames[-1]
    yours = next((f for f in reversed(frames) if f.owner == "yours"), None)
    if yours is None:
        return f"{inner.owner} code at {inner}"
    if yours == inner:
        return f"your code at {inner}"
    return f"your code at {yours} ({inner.owner} at {inner})"


# ---- this process ---------------------------------------------------------------------------

def write_own_stacks(handle) -> None:
    """Every thread's stack of this process into the open file `handle` (faulthandler)."""
    handle.flush()
    faulthandler.dump_traceback(handle, all_threads=True)


def main_stack() -> tuple[list[Frame], object]:
    """The main thread's frames (outermost first) and its innermost frame object."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    innermost = frame
    frames = []
    while frame is not None:
        frames.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return list(reversed(frames)), innermost


def waited_worker(innermost) -> int | None:
    """The pid of the loader worker whose batch the main thread waits for (torch's
    DataLoader, or hpctrain's batch buffers), where its frames say it; else None."""
    frame = innermost
    while frame is not None:
        mine = frame.f_locals
        loader = mine.get("self")
        if frame.f_code.co_name == "_next_data" and hasattr(loader, "_task_info"):
            info = loader._task_info.get(loader._rcvd_idx)
            if info is not None and len(info) == 1:  # not received yet
                return loader._workers[info[0]].pid
        if frame.f_code.co_name == "_pass" and "number" in mine and "workers" in mine:
            processes = mine["workers"].processes
            return processes[mine["number"] % len(processes)].pid
        frame = frame.f_back
    return None


def waiting_on(pid: int, thread: int | None = None) -> str | None:
    """What a thread blocked in a system call waits on, where /proc tells (this process's
    own threads, and its children's): 'reading PATH', 'opening a file', 'a lock', ..."""
    base = Path(f"/proc/{pid}") / ("task" if thread else "") / (str(thread) if thread else "")
    try:
        call, *arguments = read_text_capped(base / "syscall").split()
    except (OSError, ValueError):
        return None
    kind = _CALLS.get(platform.machine(), {}).get(int(call) if call.isdigit() else -1)
    if kind == "read" and arguments:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{int(arguments[0], 16)}")
        except (OSError, ValueError):
            return "reading a file"
        return f"reading {path}"
    return {"open": "opening a file", "lock": "waiting on a lock", "child": "waiting for a "
            "child process", "poll": "waiting for a pipe or socket", "socket": "waiting for "
            "a socket"}.get(kind)


# ---- a loader worker ---------------------------------------------------------------------

def arm_in_worker(trainer: int) -> None:
    """In a loader worker, first thing: its stacks written on DUMP_SIGNAL into an anonymous
    file the training process reads; the training process (`trainer`: its pid) and py-spy
    started by it allowed to read its memory and /proc (Yama's ptrace_scope 1 admits only a
    declared tracer and its children)."""
    try:
        memory = os.memfd_create(MEMORY_FILE)
        faulthandler.register(DUMP_SIGNAL, file=memory, all_threads=True, chain=False)
    except (AttributeError, OSError, RuntimeError, ValueError):
        pass
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, trainer, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _memory_file(pid: int) -> Path | None:
    try:
        for entry in os.scandir(f"/proc/{pid}/fd"):
            if os.readlink(entry.path).startswith(f"/memfd:{MEMORY_FILE}"):
                return Path(entry.path)
    except OSError:
        return None
    return None


@dataclass
class WorkerStacks:
    pid: int
    text: str  # every thread's stack, as the tool wrote them
    frames: list[Frame]  # its main thread's, outermost first
    tool: str  # py-spy, faulthandler, or none
    armed: bool  # it ran arm_in_worker: past its fork
    started: str | None = None  # how: fork, forkserver, spawn (multiprocessing's method)
    waits: str | None = None  # what it waited on before its stacks were read (/proc)

    def where(self) -> str:
        """Where the worker hangs, and on what."""
        forking = not self.frames or self.frames[-1].function.rsplit(".", 1)[-1] == "_launch"
        if not self.armed and forking and self.started in ("fork", None):
            return ("stuck in its fork before its first line of Python: a lock another "
                    "thread of the training process held when it forked (CPython gh-112275, "
                    "Python before 3.12); data.worker_start=forkserver starts workers from a "
                    "process without threads")
        if self.tool == "none":
            return "its stacks cannot be read (install py-spy, or allow ptrace)" + (
                "; it never reached its first line as a worker" if not self.armed else "")
        waits = self.waits or waiting_on(self.pid)
        said = place(self.frames) + (f", {waits}" if waits else "")
        taken_here = self.frames and not self.frames[-1].file.endswith("threading.py")
        if waits == "waiting on a lock" and self.started == "fork" and taken_here:
            said += (" (it was forked from the training process: a lock another thread held "
                     "at the fork stays held in the worker for good; data.worker_start="
                     "forkserver starts workers from a process without threads)")
        return said


def worker_stacks(pid: int, started: str | None = None) -> WorkerStacks:
    """A child worker's stacks: py-spy's, else its own faulthandler's, else none; `started`:
    how it was started (fork, forkserver, spawn)."""
    armed = _memory_file(pid) is not None
    waits = waiting_on(pid)  # now: reading its stacks interrupts the call it waits in
    tool = shutil.which("py-spy")
    if tool is not None:
        try:
            done = run_command([tool, "dump", "--pid", str(pid), "--json"], PY_SPY_SECONDS)
            if done.returncode == 0:
                return WorkerStacks(pid, _py_spy_text(done.stdout), _py_spy_main(done.stdout),
                                    "py-spy", armed, started, waits)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    if armed:
        text = _signalled_stacks(pid)
        if text:
            return WorkerStacks(pid, text, _faulthandler_main(text), "faulthandler", armed,
                                started, waits)
    return WorkerStacks(pid, "", [], "none", armed, started, waits)


def _py_spy_threads(output: str) -> list[dict]:
    threads = json.loads(output)
    return threads if isinstance(threads, list) else []


def _py_spy_main(output: str) -> list[Frame]:
    """py-spy's frames of the worker's main thread (innermost first there), outermost first."""
    for thread in _py_spy_threads(output):
        if thread.get("thread_name") == "MainThread" or thread.get("os_thread_id") == \
                thread.get("pid"):
            return [Frame(f["filename"], f["line"], f["name"])
                    for f in reversed(thread.get("frames") or [])]
    return []


def _py_spy_text(output: str) -> str:
    lines = []
    for thread in _py_spy_threads(output):
        lines.append(f"Thread {thread.get('os_thread_id')} ({thread.get('thread_name')}):")
        lines += [f"  File \"{f['filename']}\", line {f['line']} in {f['name']}"
                  for f in thread.get("frames") or []]
    return "\n".join(lines) + "\n"


def _signalled_stacks(pid: int, wait: float = 2.0) -> str:
    """The worker's faulthandler output after DUMP_SIGNAL, read from its memory file once it
    stops growing."""
    memory = _memory_file(pid)
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        return ""
    deadline, text = time.monotonic() + wait, ""
    while time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            with open(memory, "rb") as dump:  # /proc/PID/fd/N: a link by nature, followed
                now = dump.read(DUMP_CAP).decode(errors="replace")
        except OSError:
            return text
        if now and now == text:
            break
        text = now
    return text


_FAULTHANDLER_FRAME = re.compile(r'File "(.+)", line (\d+) in (.+)')


def _faulthandler_main(text: str) -> list[Frame]:
    """The worker's main thread in faulthandler's output (the one multiprocessing started
    the process in), outermost first."""
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text):
        frames = [Frame(file, int(line), function)
                  for file, line, function in _FAULTHANDLER_FRAME.findall(block)]
        if any(f.function == "_bootstrap" and f.file.endswith("multiprocessing/process.py")
               for f in frames):
            return list(reversed(frames))
    return []
