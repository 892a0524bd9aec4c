"""One pass over a trace file into compact columns: what the analysis needs, nothing more.

A Kineto trace holds every event as a JSON object; the analysis needs a few numbers of each.
`collect` streams the file once (trace.iter_events) and appends those numbers to typed
arrays, interning names, so a gigabyte trace becomes tens of megabytes of columns. Events
are kept by role: profiler steps and hpctrain regions, CPU operators (for self time, matrix
shapes and synchronising calls), Python frames (for call sites), CUDA runtime calls, GPU
kernels and copies, and the peak of the memory counters.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hpctrain.profiling import kernels
from hpctrain.profiling.names import PREFIX
from hpctrain.profiling.trace import TraceError, iter_events, part_ranges, read_header

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
PART_BYTES = 64 << 20  # a process's start costs about what 20 MB of JSON do


class Columns:
    """Named typed arrays filled row by row, read back as NumPy arrays."""

    def __init__(self, **types: str):
        self._arrays = {name: array(code) for name, code in types.items()}

    def add(self, *values) -> None:
        for column, value in zip(self._arrays.values(), values):
            column.append(value)

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_"):  # not a column (unpickling asks before _arrays is set)
            raise AttributeError(name)
        try:
            return np.frombuffer(self._arrays[name], dtype=self._arrays[name].typecode) \
                if len(self._arrays[name]) else np.zeros(0)
        except KeyError:
            raise AttributeError(name) from None

    def __len__(self) -> int:
        return len(next(iter(self._arrays.values())))

    def extend(self, other: Columns, names: np.ndarray) -> None:
        """Append `other`'s rows, its `name` ids translated through `names`."""
        for column, values in self._arrays.items():
            self._arrays[column].extend(
                array(values.typecode, names[getattr(other, column)].tolist())
                if column == "name" and len(other) else other._arrays[column])


def _spans() -> Columns:
    return Columns(tid="q", start="d", end="d", name="l")


@dataclass
class RankTrace:
    """The columns of one rank's trace. Times in microseconds, names as ids into `names`."""

    path: Path
    rank: int
    world_size: int
    names: list[str] = field(default_factory=list)
    steps: Columns = field(default_factory=lambda: Columns(number="q", start="d", end="d"))
    regions: Columns = field(default_factory=_spans)
    ops: Columns = field(default_factory=_spans)
    python: Columns = field(default_factory=_spans)
    runtime: Columns = field(default_factory=lambda: Columns(
        tid="q", start="d", end="d", name="l", correlation="q"))
    gpu: Columns = field(default_factory=lambda: Columns(
        start="d", end="d", stream="q", name="l", kind="b", correlation="q"))
    matrix_ops: dict = field(default_factory=dict)  # (op, dims, dtype) -> [calls, microseconds]
    blocking_copies: set = field(default_factory=set)  # correlation ids of DtoH pageable copies
    peak_memory: dict = field(default_factory=dict)  # device id (-1: host) -> bytes allocated
    main_tid: int | None = None  # the thread that runs the training steps
    _ids: dict = field(default_factory=dict, repr=False)  # name -> its index in names

    @property
    def is_gpu(self) -> bool:
        return len(self.gpu) > 0

    def name_of(self, ids: np.ndarray) -> list[str]:
        return [self.names[i] for i in ids]

    def intern(self, name: str) -> int:
        number = self._ids.get(name)
        if number is None:
            number = self._ids[name] = len(self.names)
            self.names.append(name)
        return number

    def absorb(self, later: RankTrace) -> None:
        """Append the columns of the trace's next piece, read apart (its own name ids)."""
        names = np.array([self.intern(name) for name in later.names] or [0], dtype=np.int64)
        for table in ("steps", "regions", "ops", "python", "runtime", "gpu"):
            getattr(self, table).extend(getattr(later, table), names)
        for key, (calls, microseconds) in later.matrix_ops.items():
            mine = self.matrix_ops.setdefault(key, [0, 0.0])
            mine[0] += calls
            mine[1] += microseconds
        self.blocking_copies |= later.blocking_copies
        for device, peak in later.peak_memory.items():
            self.peak_memory[device] = max(self.peak_memory.get(device, 0), peak)
        if len(later.steps):
            self.main_tid = later.main_tid


def collect(path: Path | str, rank: int | None = None, processes: int | None = None,
            part_bytes: int = PART_BYTES) -> RankTrace:
    """Read one trace file into columns. The rank is taken from the trace's distributedInfo,
    else from a `rank<N>` in the file name, else `rank` (default 0). A trace of at least two
    `part_bytes` (uncompressed) is read in pieces by up to `processes` processes (default:
    the cores this process may use): decoding JSON is the cost, one core's work. A gzip
    trace too: each piece's process decompresses the stream up to its piece and discards it."""
    path = Path(path)
    info = read_header(path).get("distributedInfo") or {}
    trace = RankTrace(path, _rank(path, info, rank), int(info.get("world_size", 1)))
    parts = part_ranges(path, processes or len(os.sched_getaffinity(0)), part_bytes)
    events = _collect_parts(trace, parts) if len(parts) > 1 else None
    if events is None:  # one piece, or a piece refused: the whole file names the damage
        trace = RankTrace(trace.path, trace.rank, trace.world_size)
        events = _fill(trace, iter_events(path))
    if events == 0:
        raise TraceError(f"{path} holds no events")
    if len(trace.steps) == 0:
        raise TraceError(f"{path} has no ProfilerStep#N ranges: it was not recorded with a "
                         "torch.profiler schedule stepped once per training step (prof.step()); "
                         "record it with hpctrain profile RECIPE")
    return trace


def _collect_parts(trace: RankTrace, parts: list[tuple[int, int | None]]) -> int | None:
    """Fill `trace` from the pieces, the first here and each other one in a fresh Python
    (not a fork: this process may hold torch's threads; not multiprocessing's spawn: it runs
    the caller's script again); the number of events, or None where a piece was refused
    (damaged, or its cut not between two events)."""
    others = [subprocess.Popen([sys.executable, "-c", _PIECE, str(trace.path), str(start),
                                str(end)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
              for start, end in parts[1:]]
    try:
        events = _fill(trace, iter_events(trace.path, part=parts[0]))
        for other in others:
            output = other.communicate()[0]
            if other.returncode != 0:
                return None
            piece, count = pickle.loads(output)
            trace.absorb(piece)
            events += count
    except TraceError:
        return None
    finally:
        for other in others:
            other.kill()
            other.wait()
    return events


_PIECE = "import sys; from hpctrain.profiling.collect import _piece; _piece(*sys.argv[1:])"


def _piece(path: str, start: str, end: str) -> None:
    """A piece's process: its columns, pickled on stdout (exit code 2 if refused)."""
    piece = RankTrace(Path(path), 0, 1)
    try:
        count = _fill(piece, iter_events(path, part=(int(start),
                                                    None if end == "None" else int(end))))
    except TraceError:
        sys.exit(2)
    sys.stdout.buffer.write(pickle.dumps((piece, count)))


def _fill(trace: RankTrace, events) -> int:
    """Append the events' numbers to the trace's columns; how many events there were."""
    intern, count = trace.intern, 0
    for event in events:
        count += 1
        phase, category, name = event.get("ph"), event.get("cat"), event.get("name", "")
        if phase == "i":
            if name == "[memory]":
                _memory_event(trace, event.get("args", {}))
            continue
        if phase != "X" or "dur" not in event:
            continue
        start = float(event["ts"])
        end = start + float(event["dur"])
        if category == "python_function":
            trace.python.add(_tid(event), start, end, intern(name))
        elif category == "cpu_op":
            trace.ops.add(_tid(event), start, end, intern(name))
            if name in kernels.MATRIX_OPS:
                _matrix_op(trace, name, event.get("args", {}), end - start)
        elif category == "user_annotation":
            step = _STEP.match(name)
            if step:
                trace.steps.add(int(step.group(1)), start, end)
                trace.main_tid = _tid(event)
            elif name.startswith(PREFIX):
                trace.regions.add(_tid(event), start, end, intern(name[len(PREFIX):]))
        elif category in ("cuda_runtime", "cuda_driver"):
            trace.runtime.add(_tid(event), start, end, intern(name),
                              int(event.get("args", {}).get("correlation", -1)))
        elif category in ("kernel", "gpu_memcpy", "gpu_memset"):
            args = event.get("args", {})
            correlation = int(args.get("correlation", -1))
            trace.gpu.add(start, end, int(args.get("stream", 0)), intern(name),
                          kernels.kernel_kind(category, name), correlation)
            if category == "gpu_memcpy" and kernels.blocking_copy(name):
                trace.blocking_copies.add(correlation)
    return count


def _rank(path: Path, info: dict, rank: int | None) -> int:
    """The trace's rank: its distributedInfo's, else a `rank<N>` in the file name, else
    `rank` (default 0)."""
    if "rank" in info:
        return int(info["rank"])
    if rank is not None:
        return rank
    found = re.search(r"rank[-_.]?(\d+)", path.name)
    return int(found.group(1)) if found else 0


def _memory_event(trace: RankTrace, args: dict) -> None:
    """The allocator's total on a device: the peak so far."""
    device = int(args.get("Device Id", -1))
    trace.peak_memory[device] = max(trace.peak_memory.get(device, 0),
                                    int(args.get("Total Allocated", 0)))


def _matrix_op(trace: RankTrace, name: str, args: dict, microseconds: float) -> None:
    """One call of a matrix operator, counted by its shapes and dtype (for the check of
    dimensions that are not multiples of 8)."""
    key = (name, _frozen(args.get("Input Dims")), (args.get("Input type") or ["?"])[0])
    calls = trace.matrix_ops.setdefault(key, [0, 0.0])
    calls[0] += 1
    calls[1] += microseconds


def _tid(event: dict) -> int:
    tid = event.get("tid", 0)
    return tid if isinstance(tid, int) else hash(tid) & 0x7FFFFFFF


def _frozen(dims) -> tuple:
    return tuple(tuple(d) if isinstance(d, list) else d for d in (dims or ()))
