"""Inside the input pipeline's processes: which Python functions the training process and its
loader workers spend their time in, and how that splits into reading, decoding,
augmentation, transport and the rest (`hpctrain bench data --python`).

py-spy (`pip install py-spy`, a static binary) samples this process and its children from
outside, 100 times a second, without slowing them. Where py-spy is missing or may not attach
(ptrace forbidden: /proc/sys/kernel/yama/ptrace_scope, containers), the loader runs once more
in this process under cProfile: the same reading, decoding and augmentation, but no workers,
so no transport is seen (said so in the result).

A sample is put in a stage by its innermost frame that names one (the decoder called from the
augmentation code is decoding); native code counts for the Python line that called it.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpctrain.readers import read_text_capped

PROFILE_CAP = 1 << 30  # py-spy's collapsed stacks of a measurement: some MB
STAGES = ("reading", "decoding", "augmentation", "transport", "rest")
_PATTERNS = [  # innermost match wins; checked in this order within a frame
    ("decoding", re.compile(r"decode_jpeg|decode_full|stored_pixels|ImageFile\.load|"
                            r"Image\.convert|\bdraft\b|decompress|simplejpeg")),
    ("reading", re.compile(r"ShardReader\.read|crc32|memmap|\bread\b|\bopen\b|readinto|"
                           r"raw_pixels|_load \(image_folders")),
    ("augmentation", re.compile(r"render_view|interpolate|upsample|\bflip\b|draw_view|"
                                r"crop_rows_columns|decode_crop|RandomResizedCrop|resize")),
    ("transport", re.compile(r"collate|\bstack\b|pickle|Pickler|rebuild_|reduce_storage|"
                             r"Queue\.(put|get)|_recv|_send|connection\.py|queues\.py|"
                             r"share_memory|_shared|pin_memory")),
]
# a loader worker's outermost own frame: batch buffers' worker or torch's DataLoader worker
_WORKER_LOOP = re.compile(r"^(_work \(\S*batch_buffers\.py|_worker_loop \(\S*worker\.py):")
TOP = 5


@dataclass
class ProcessProfile:
    role: str  # "training process", "worker" or "other process" (a child that is neither)
    pid: int | None
    samples: int
    stages: dict[str, float]  # stage -> share of this process's samples
    hottest: list[tuple[str, float]]  # (function (file:line), share), innermost frames


@dataclass
class InputProfile:
    tool: str  # "py-spy" or "cProfile"
    seconds: float
    processes: list[ProcessProfile] = field(default_factory=list)
    note: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        out = [f"inside the processes ({self.tool}, {self.seconds:.0f} s)"
               + (f": {self.note}" if self.note else "")]
        out.append(f"  {'process':<26}{'samples':>8}" + "".join(f"{s:>14}" for s in STAGES))
        for p in self.processes:
            name = p.role + (f" {p.pid}" if p.pid else "")
            out.append(f"  {name:<26}{p.samples:>8}"
                       + "".join(f"{p.stages[s]:>14.0%}" for s in STAGES))
        for p in self.processes:
            hottest = ", ".join(f"{name} {share:.0%}" for name, share in p.hottest)
            out.append(f"  hottest in {p.role}{f' {p.pid}' if p.pid else ''}: {hottest}")
        return out


def stage_of(frames: list[str]) -> str:
    """The stage of one sample, from its frames (outermost first)."""
    for frame in reversed(frames):
        for stage, pattern in _PATTERNS:
            if pattern.search(frame):
                return stage
    return "rest"


def _summarise(role: str, pid: int | None, weighted: list[tuple[list[str], float]]
               ) -> ProcessProfile:
    total = sum(count for _, count in weighted) or 1
    stages, leaves = Counter(), Counter()
    for frames, count in weighted:
        stages[stage_of(frames)] += count
        if frames:
            leaves[frames[-1]] += count
    return ProcessProfile(role, pid, round(sum(c for _, c in weighted)),
                          {s: stages[s] / total for s in STAGES},
                          [(name, count / total) for name, count in leaves.most_common(TOP)])


_PROCESS = re.compile(r'process (\d+):"')  # a process's part of a stack, its command quoted


def _records(text: str) -> list[tuple[int | None, list[str], int]]:
    """(the innermost process's pid or None, frames, count) per sampled stack of py-spy's raw
    output. A stack is one line, but a command line quoted in it may hold line breaks
    (`python -c` with a script): with --subprocesses, a stack starts at `process PID:`."""
    if text.startswith("process "):
        stacks = re.split(r"\n(?=process \d+:\")", text)
    else:
        stacks = text.splitlines()
    found = []
    for stack in stacks:
        stack, _, count = stack.strip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        pid, frames = None, stack
        if (last := list(_PROCESS.finditer(stack))[-1:]):
            pid, quoted_end = int(last[0].group(1)), stack.find('";', last[0].end())
            frames = stack[quoted_end + 2:] if quoted_end >= 0 else ""
        found.append((pid, [f for f in frames.split(";") if f], int(count)))
    return found


def parse_py_spy(text: str, root: int, before: frozenset[int] = frozenset()) \
        -> list[ProcessProfile]:
    """py-spy's raw output (`process PID:"cmd";...;frame (file:line) COUNT` per stack, with
    --subprocesses) per process: `root` is the training process, a child seen in a loader
    worker's loop a worker, any other child (a fork server, a resource tracker, what the
    caller started before: `before`, the processes there when sampling began, though one be
    another loader's worker) another process."""
    by_pid: dict[int, list[tuple[list[str], int]]] = defaultdict(list)
    for pid, frames, count in _records(text):
        by_pid[root if pid is None else pid].append((frames, count))

    def role(pid: int) -> str:
        if pid == root:
            return "training process"
        if pid in before:
            return "other process"
        seen_working = any(_WORKER_LOOP.match(frame) for frames, _ in by_pid[pid]
                           for frame in frames)
        return "worker" if seen_working else "other process"

    order = ("training process", "worker", "other process")
    roles = {pid: role(pid) for pid in by_pid}
    return [_summarise(roles[pid], pid, by_pid[pid])
            for pid in sorted(by_pid, key=lambda pid: (order.index(roles[pid]), pid))]


def py_spy_available() -> str | None:
    """py-spy's path, or None."""
    return shutil.which("py-spy")


class Recording:
    """py-spy sampling this process and its children (100 Hz, only while on a CPU) from
    construction to `stop()`; `failed` says why not where it could not start."""

    def __init__(self):
        self.failed: str | None = None
        self.started = time.monotonic()
        spy = py_spy_available()
        if spy is None:
            self.failed = "py-spy is not installed (pip install py-spy)"
            return
        self._before = descendants(os.getpid())  # none of them the loader's workers
        self._folder = tempfile.TemporaryDirectory(prefix="hpctrain-py-spy-")
        self._output = Path(self._folder.name) / "samples.txt"
        self._recorder = subprocess.Popen(
            [spy, "record", "--pid", str(os.getpid()), "--subprocesses", "--rate", "100",
             "--format", "raw", "--nonblocking", "--output", str(self._output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)  # attached, or failed to
        if self._recorder.poll() is not None:
            self.failed = _why(self._recorder.communicate()[1])
            self._folder.cleanup()

    def stop(self) -> InputProfile | None:
        """What was sampled, or None (then `failed` says why)."""
        if self.failed:
            return None
        self._recorder.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        errors = self._recorder.communicate(timeout=60)[1]
        try:
            if self._output.is_file() and self._output.stat().st_size:
                return InputProfile("py-spy", time.monotonic() - self.started,
                                    parse_py_spy(read_text_capped(self._output, PROFILE_CAP),
                                                 os.getpid(), self._before))
            self.failed = _why(errors)
            return None
        finally:
            self._folder.cleanup()


def descendants(pid: int) -> frozenset[int]:
    """The processes below `pid` (children, theirs, ...), as /proc lists them now, whichever
    thread started them."""
    found, below = set(), [pid]
    while below:
        parent = below.pop()
        children = set()
        try:
            for thread in os.scandir(f"/proc/{parent}/task"):
                children.update(int(c) for c in
                                read_text_capped(Path(thread.path) / "children").split())
        except OSError:  # it ended meanwhile, or there is no /proc
            continue
        below += children - found
        found |= children
    return frozenset(found)


def _why(errors: str | None) -> str:
    last = (errors or "").strip().splitlines()[-1:] or ["no samples"]
    return f"py-spy could not sample this process ({last[0][:200]})"


def sample(run: Callable[[float], None], seconds: float,
           run_inline: Callable[[float], None]) -> InputProfile:
    """Profile `run(seconds)` (the loader with its workers) with py-spy from outside; where
    py-spy cannot, `run_inline(seconds)` (the loader without workers) under cProfile."""
    recording = Recording()
    if not recording.failed:
        run(seconds)
        if (found := recording.stop()) is not None:
            found.seconds = seconds
            return found
    profile = under_cprofile(lambda: run_inline(seconds))
    profile.note = (f"{recording.failed}: the loader ran without workers in this process, so "
                    "transport is not measured")
    return profile


def under_cprofile(work: Callable[[], object]) -> InputProfile:
    """`work()` in this process under cProfile, as the profile of the training process (the
    workers, other processes, are not seen)."""
    started = time.monotonic()
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        work()
    finally:
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    weighted = []
    for (file, line, name), (_, _, own, _, callers) in stats.items():
        frame = f"{name} ({Path(file).name}:{line})"
        caller = next(iter(callers), None)  # one caller is enough to place native calls
        frames = [f"{caller[2]} ({Path(caller[0]).name}:{caller[1]})", frame] if caller \
            else [frame]
        weighted.append((frames, own * 100))  # seconds as samples at py-spy's 100 Hz
    return InputProfile("cProfile", time.monotonic() - started,
                        [_summarise("training process", os.getpid(), weighted)])
