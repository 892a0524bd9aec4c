"""From a trace's columns to evidence: where the step's time goes, in numbers.

Definitions follow Holistic Trace Analysis (HTA), so figures can be compared with it:
- the GPU span runs from the first kernel's start to the last kernel's end; busy time is the
  union of all kernels, copies and memsets; idle is the rest of the span;
- each idle gap is classed by the kernel that ends it: *host-wait* when the CPU launched that
  kernel only after the gap began (the GPU waited for the host), *kernel-wait* when the gap is
  shorter than 30 us (back-to-back launch overhead), *other* otherwise (events, other streams);
  unlike HTA, gaps are taken over the whole device, not per stream, so the three parts add
  up to the idle time of the span;
- short kernels run for less time on the GPU than their launch call took on the CPU;
- communication overlap is the share of NCCL time during which computation also runs.
On top of HTA, idle time is attributed to its causes: data-loader waits (the hpctrain
data_wait region), host synchronisation (a sync call ending inside the gap) and, for the
host-wait rest, launch overhead; these are the losses the verdict ranks.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np

from hpctrain.profiling import intervals as iv
from hpctrain.profiling import kernels
from hpctrain.profiling.collect import RankTrace
from hpctrain.profiling.names import REGIONS

KERNEL_WAIT_US = 30.0
TOP = 10
SYNC_SITES_SCANNED = 500
# frames that only pass a call on (decorators, the standard library's plumbing, the profiler)
_PLUMBING = ("<built-in", "<frozen", "threading.py", "contextlib.py", "hpctrain/profiling/",
             "functools.py", "typing.py", "torch/utils/_contextlib.py", "torch/profiler/",
             "torch/autograd/profiler")


@dataclass
class Evidence:
    """What one rank's trace shows. Times in milliseconds, shares as fractions."""

    rank: int
    trace: str
    gpu: bool
    steps: int
    step_ms: dict  # mean, std, min, max over the active steps
    regions: dict  # region -> {mean_ms, std_ms, min_ms, max_ms, share}; "other" = the rest
    data_wait_share: float
    losses: dict  # cause -> share of the step (input, sync, launch, communication)
    temporal: dict | None = None  # HTA temporal breakdown: compute, non_compute, idle shares
    idle: dict | None = None  # idle split: host_wait, kernel_wait, other (shares of idle)
    launch: dict | None = None
    sync: dict = field(default_factory=dict)
    communication: dict | None = None
    tensor_cores: dict | None = None
    kernel_mix: dict | None = None  # compute kernel time: matrix vs memory-bound elementwise
    matrix_dims: dict = field(default_factory=dict)
    top_ops: list = field(default_factory=list)
    top_kernels: list = field(default_factory=list)
    peak_memory_bytes: dict = field(default_factory=dict)
    timeline: dict = field(default_factory=dict, repr=False)  # one step, for the picture

    def to_json(self) -> dict:
        values = asdict(self)
        del values["timeline"]
        return values


def _ms(us: float) -> float:
    return us / 1000.0


def _stats(values_us: np.ndarray) -> dict:
    return {"mean_ms": _ms(float(values_us.mean())), "std_ms": _ms(float(values_us.std())),
            "min_ms": _ms(float(values_us.min())), "max_ms": _ms(float(values_us.max()))}


def analyse(trace: RankTrace) -> Evidence:
    order = np.argsort(trace.steps.start)
    step_start, step_end = trace.steps.start[order], trace.steps.end[order]
    step_us = step_end - step_start
    window = (float(step_start[0]), float(step_end[-1]))
    regions = _region_split(trace, step_start, step_end)
    data_wait = regions.get("data_wait", {}).get("share", 0.0)
    evidence = Evidence(
        rank=trace.rank, trace=str(trace.path), gpu=trace.is_gpu, steps=len(step_us),
        step_ms={k.replace("_ms", ""): v for k, v in _stats(step_us).items()},
        regions=regions, data_wait_share=data_wait, losses={"input": data_wait},
        top_ops=_top_ops(trace, window), matrix_dims=_matrix_dims(trace),
        peak_memory_bytes={("host" if d < 0 else f"cuda:{d}"): b
                           for d, b in sorted(trace.peak_memory.items())})
    evidence.sync = _sync(trace, window, len(step_us), float(step_us.mean()))
    if trace.is_gpu:
        _gpu_evidence(trace, evidence, window)
    median = int(np.argsort(step_us)[len(step_us) // 2])
    evidence.timeline = _timeline(trace, float(step_start[median]), float(step_end[median]))
    return evidence


def _timeline(trace: RankTrace, start: float, end: float, detail: int = 1500) -> dict:
    """One step as lanes of [start, duration, label] in ms from the step's start: the hpctrain
    regions, the host waits, and the GPU's work by class during the step's CPU time. Spans
    closer than 1/detail of the step are drawn merged, so a lane stays light."""
    lanes: dict[str, list] = {}
    rows = (trace.regions.start < end) & (trace.regions.end > start)
    lanes["regions"] = [[_ms(a - start), _ms(b - a), trace.names[n]] for a, b, n in zip(
        np.maximum(trace.regions.start[rows], start), np.minimum(trace.regions.end[rows], end),
        trace.regions.name[rows])]
    ends = _sync_ends(trace, with_starts=True)
    waits = iv.clip(iv.union(*ends), start, end) if len(ends[0]) else iv.EMPTY
    lanes["host waits"] = [[_ms(a - start), _ms(b - a), "sync"] for a, b in zip(*waits)]
    if trace.is_gpu:
        gpu = trace.gpu
        by_name = np.array([kernels.is_matrix(name) for name in trace.names], dtype=bool)
        matrix = by_name[gpu.name]
        classes = {"GPU matrix": (gpu.kind == kernels.COMPUTE) & matrix,
                   "GPU other compute": (gpu.kind == kernels.COMPUTE) & ~matrix,
                   "communication": gpu.kind == kernels.COMMUNICATION,
                   "memory copies": gpu.kind == kernels.MEMORY}
        joint = (end - start) / detail
        for lane, rows in classes.items():
            merged = iv.union(gpu.start[rows], gpu.end[rows] + joint)
            merged = iv.clip((merged[0], merged[1] - joint), start, end)
            lanes[lane] = [[_ms(a - start), _ms(b - a), lane] for a, b in zip(*merged)]
    return {"step_ms": _ms(end - start), "lanes": lanes}


def _region_split(trace: RankTrace, step_start: np.ndarray, step_end: np.ndarray) -> dict:
    """Each region's time per active step; 'other' is the step time no region covers."""
    names = trace.name_of(trace.regions.name) if len(trace.regions) else []
    starts, ends = trace.regions.start, trace.regions.end
    index = np.searchsorted(step_start, starts, side="right") - 1
    inside = (index >= 0) & (starts < step_end[np.clip(index, 0, None)])
    per_step = {name: np.zeros(len(step_start)) for name in REGIONS}
    for i, name, start, end, ok in zip(index, names, starts, ends, inside):
        if ok:
            per_step.setdefault(name, np.zeros(len(step_start)))[i] += end - start
    step_us = step_end - step_start
    per_step["other"] = np.maximum(step_us - sum(per_step.values()), 0.0)
    mean_step = float(step_us.mean())
    return {name: {**_stats(values), "share": float(values.mean()) / mean_step}
            for name, values in per_step.items() if values.any() or name in REGIONS}


def _self_times(ops_tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each operator's time minus that of the operators it calls (same thread, nested)."""
    own = end - start
    order = np.lexsort((-end, start, ops_tid))
    stack: list[int] = []
    current_tid = None
    for i in order:
        if ops_tid[i] != current_tid:
            stack, current_tid = [], ops_tid[i]
        while stack and end[stack[-1]] <= start[i]:
            stack.pop()
        if stack:
            own[stack[-1]] -= end[i] - start[i]
        stack.append(i)
    return own


def _top_ops(trace: RankTrace, window: tuple[float, float]) -> list:
    ops = trace.ops
    if len(ops) == 0:
        return []
    inside = (ops.start >= window[0]) & (ops.start < window[1])
    own = _self_times(ops.tid[inside], ops.start[inside], ops.end[inside])
    names = ops.name[inside]
    totals = np.bincount(names, weights=own, minlength=len(trace.names))
    calls = np.bincount(names, minlength=len(trace.names))
    whole = float(own.sum()) or 1.0
    return [{"name": trace.names[i], "calls": int(calls[i]), "self_ms": _ms(totals[i]),
             "share": totals[i] / whole} for i in np.argsort(-totals)[:TOP] if calls[i]]


def _matrix_dims(trace: RankTrace) -> dict:
    """Matrix operators with a dimension that is not a multiple of 8, and the dtype mix."""
    total = sum(us for _, us in trace.matrix_ops.values()) or 1.0
    offenders, dtypes = [], defaultdict(float)
    for (op, dims, dtype), (calls, us) in trace.matrix_ops.items():
        dtypes[dtype] += us / total
        odd = {k: v for k, v in kernels.matrix_dims(op, dims).items() if v % 8}
        if odd:
            offenders.append({"op": op, "shapes": [list(d) for d in dims if d][:3],
                              "dims_not_multiple_of_8": odd, "calls": calls,
                              "share_of_matrix_time": us / total})
    offenders.sort(key=lambda o: -o["share_of_matrix_time"])
    return {"offenders": offenders[:TOP],
            "share_of_matrix_time": sum(o["share_of_matrix_time"] for o in offenders),
            "dtypes": dict(sorted(dtypes.items(), key=lambda kv: -kv[1]))}


def _innermost(starts, ends, tids, tid: int, start: float, end: float) -> int | None:
    """The row of the innermost span on `tid` that encloses [start, end], or None."""
    enclosing = np.flatnonzero((tids == tid) & (starts <= start) & (ends >= end))
    return int(enclosing[np.argmax(starts[enclosing])]) if len(enclosing) else None


def _call_site(trace: RankTrace, tid: int, start: float,
               end: float) -> tuple[str | None, str | None]:
    """(the innermost Python frame that reads, the frame outside its library that called
    it, or None where the read is not in a library's code): a read inside torch's AdamW is
    torch's, called from hpctrain's optimiser step, not hpctrain's own."""
    py = trace.python
    if len(py) == 0:
        return None, None
    enclosing = np.flatnonzero((py.tid == tid) & (py.start <= start) & (py.end >= end))
    frames = [trace.names[py.name[row]] for row in enclosing[np.argsort(-py.start[enclosing])]]
    frames = [name for name in frames if not name.startswith(_PLUMBING)
              and not name.startswith("python")]
    if not frames:
        return None, None
    if not is_library_frame(frames[0]):
        return frames[0], None
    return frames[0], next((name for name in frames if not is_library_frame(name)), None)


def is_library_frame(name: str) -> bool:
    """Whether a frame (as the profiler names it: `package/module.py(line): function`, or a
    whole path) is an installed library's: torch's, or a package under site-packages; not
    hpctrain's, nor your script's."""
    if "/site-packages/" in name or "/dist-packages/" in name:
        return "/hpctrain/" not in name
    top = name.split("/", 1)[0] if "/" in name else ""
    return bool(top) and top != "hpctrain" and _installed(top)


@functools.lru_cache(maxsize=256)
def _installed(package: str) -> bool:
    """Whether `package` imports from site-packages (an installed library)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    origin = (spec.origin or "") if spec else ""
    return "site-packages" in origin or "dist-packages" in origin


def _sync(trace: RankTrace, window: tuple[float, float], steps: int, step_us: float) -> dict:
    """Host-device synchronisations inside the steps: blocking CUDA calls on a GPU trace,
    `.item()`-style reads (which block on a GPU) on any trace, with their call sites."""
    rt, ops = trace.runtime, trace.ops
    if trace.is_gpu:
        rows = [i for i in _sync_rows(trace) if window[0] <= rt.start[i] < window[1]]
        table = rt
    else:
        item_ids = [i for i, n in enumerate(trace.names) if n in kernels.ITEM_OPS]
        rows = [int(i) for i in np.flatnonzero(np.isin(ops.name, item_ids)
                                               & (ops.start >= window[0])
                                               & (ops.start < window[1]))] if item_ids else []
        table = ops
    sites: dict[tuple, list] = defaultdict(lambda: [set(), 0.0, set()])
    for row in rows[:SYNC_SITES_SCANNED]:
        tid, start, end = int(table.tid[row]), float(table.start[row]), float(table.end[row])
        op_row = _innermost(ops.start, ops.end, ops.tid, tid, start, end) if trace.is_gpu \
            else row
        op = trace.names[ops.name[op_row]] if op_row is not None else None
        site = sites[(*_call_site(trace, tid, start, end), op)]
        site[0].add(op_row if op_row is not None else -row)  # a read counts once per call
        site[1] += end - start
        site[2].add(trace.names[table.name[row]])
    waited = float(sum(table.end[r] - table.start[r] for r in rows)) if trace.is_gpu else 0.0
    return {"calls_per_step": len(rows) / steps,
            "ms_per_step": _ms(waited / steps),
            "share": waited / steps / step_us if step_us else 0.0,
            "sites": [{"call_site": site, "called_from": caller, "op": op,
                       "calls": len(reads), "ms": _ms(us), "call": ", ".join(sorted(calls))}
                      for (site, caller, op), (reads, us, calls)
                      in sorted(sites.items(), key=lambda kv: -kv[1][1])[:TOP]]}


def _launches(trace: RankTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each GPU row: its launch call's start and duration (NaN when not found)."""
    rt, gpu = trace.runtime, trace.gpu
    launch_start = np.full(len(gpu), np.nan)
    launch_dur = np.full(len(gpu), np.nan)
    found = np.zeros(len(gpu), dtype=bool)
    if len(rt):
        order = np.argsort(rt.correlation)
        keys = rt.correlation[order]
        at = np.clip(np.searchsorted(keys, gpu.correlation), 0, len(keys) - 1)
        found = (keys[at] == gpu.correlation) & (gpu.correlation >= 0)
        rows = order[at[found]]
        launch_start[found] = rt.start[rows]
        launch_dur[found] = rt.end[rows] - rt.start[rows]
    return launch_start, launch_dur, found


def _gpu_evidence(trace: RankTrace, evidence: Evidence, window: tuple[float, float]) -> None:
    """The GPU's side of the steps: busy, idle and why, launch overhead, communication and
    its overlap, the kernel mix (matrix work, Tensor Cores, precision)."""
    gpu, steps = trace.gpu, evidence.steps
    start, end, kind = gpu.start, gpu.end, gpu.kind
    busy = iv.union(start, end)
    span = float(end.max() - start.min())
    compute = iv.union(start[kind == kernels.COMPUTE], end[kind == kernels.COMPUTE])
    comm = iv.union(start[kind == kernels.COMMUNICATION], end[kind == kernels.COMMUNICATION])
    busy_us = iv.length(busy)
    evidence.temporal = {"span_ms": _ms(span), "compute": iv.length(compute) / span,
                         "non_compute": (busy_us - iv.length(compute)) / span,
                         "idle": (span - busy_us) / span,
                         "communication": iv.length(comm) / span,
                         "memory": iv.length(iv.union(start[kind == kernels.MEMORY],
                                                      end[kind == kernels.MEMORY])) / span}
    launches = _launches(trace)
    evidence.idle, evidence.losses = _idle_causes(trace, busy, span, launches)
    evidence.launch = _launch_overhead(trace, busy_us, steps, launches)
    if len(comm[0]):
        comm_us = iv.length(comm)
        overlapped = iv.overlap(comm, compute)
        evidence.communication = {"share": comm_us / span, "overlap": overlapped / comm_us,
                                  "exposed_share": (comm_us - overlapped) / span,
                                  "ms_per_step": _ms(comm_us / steps)}
        evidence.losses["communication"] = (comm_us - overlapped) / span
    _kernel_mix(trace, evidence, busy_us, steps)


def _idle_causes(trace: RankTrace, busy: iv.Intervals, span: float, launches) \
        -> tuple[dict, dict]:
    """(idle, losses): the GPU's idle gaps split as HTA does (waiting on the host, on short
    kernels, other), then the share of the span lost to input, synchronisation and launches."""
    start = trace.gpu.start
    launch_start, _, found = launches
    gap_start, gap_end = iv.gaps(busy)
    order = np.argsort(start, kind="stable")
    closer = order[np.clip(np.searchsorted(start[order], gap_end), 0, len(order) - 1)]
    gap_us = gap_end - gap_start
    host = found[closer] & (launch_start[closer] >= gap_start)
    short = ~host & (gap_us < KERNEL_WAIT_US)
    idle_us = float(gap_us.sum()) or 1.0
    idle = {"ms": _ms(float(gap_us.sum())),
            "host_wait": float(gap_us[host].sum()) / idle_us,
            "kernel_wait": float(gap_us[short].sum()) / idle_us,
            "other": float(gap_us[~host & ~short].sum()) / idle_us}
    data_wait = _region_intervals(trace, "data_wait")
    input_idle = iv.overlap((gap_start, gap_end), data_wait)
    sync_ends = _sync_ends(trace)
    after_sync = (np.searchsorted(sync_ends, gap_end, side="right")
                  - np.searchsorted(sync_ends, gap_start, side="left")) > 0
    sync_idle = max(0.0, float(gap_us[after_sync].sum())
                    - iv.overlap((gap_start[after_sync], gap_end[after_sync]), data_wait))
    launch_idle = max(0.0, float(gap_us[host].sum()) - input_idle - sync_idle)
    return idle, {"input": input_idle / span, "sync": sync_idle / span,
                  "launch": launch_idle / span}


def _launch_overhead(trace: RankTrace, busy_us: float, steps: int, launches) -> dict:
    """Kernels per step, how many are shorter than their launch, and the host's launch time."""
    start, end, kind = trace.gpu.start, trace.gpu.end, trace.gpu.kind
    launch_start, launch_dur, found = launches
    work = kind != kernels.MEMORY
    rt_names = trace.name_of(trace.runtime.name)
    launch_calls = np.array([n in kernels.LAUNCH_CALLS for n in rt_names], dtype=bool)
    cpu_launch_us = float((trace.runtime.end - trace.runtime.start)[launch_calls].sum()) \
        if len(rt_names) else 0.0
    timed = work & found
    durations = end - start
    return {
        "kernels_per_step": float(work.sum()) / steps,
        "short_kernel_share": float((durations[timed] < launch_dur[timed]).mean())
        if timed.any() else 0.0,
        "median_kernel_us": float(np.median(durations[work])) if work.any() else 0.0,
        "median_launch_delay_us": float(np.median(start[timed] - launch_start[timed]
                                                  - launch_dur[timed])) if timed.any() else 0.0,
        "cpu_launch_ms_per_step": _ms(cpu_launch_us / steps),
        "gpu_busy_ms_per_step": _ms(busy_us / steps)}


def _kernel_mix(trace: RankTrace, evidence: Evidence, busy_us: float, steps: int) -> None:
    """Kernels by name: the share of matrix work, on Tensor Cores, by precision; the top
    kernels."""
    gpu, kind = trace.gpu, trace.gpu.kind
    per_name = np.bincount(gpu.name, weights=gpu.end - gpu.start, minlength=len(trace.names))
    calls = np.bincount(gpu.name, minlength=len(trace.names))
    kind_of = np.zeros(len(trace.names), dtype=np.int8)
    kind_of[gpu.name] = kind
    matrix_us = tensor_us = compute_us = 0.0
    by_precision: dict[str, float] = defaultdict(float)
    for i in np.flatnonzero(calls):
        if kind_of[i] != kernels.COMPUTE:
            continue
        name, us = trace.names[i], float(per_name[i])
        compute_us += us
        if kernels.is_matrix(name):
            matrix_us += us
            if kernels.uses_tensor_cores(name):
                tensor_us += us
            by_precision[kernels.precision(name) or "unknown"] += us
    evidence.kernel_mix = {"matrix_share": matrix_us / compute_us if compute_us else 0.0,
                           "other_share": 1 - matrix_us / compute_us if compute_us else 0.0}
    evidence.tensor_cores = {
        "share_of_matrix_time": tensor_us / matrix_us if matrix_us else 0.0,
        "matrix_ms_per_step": _ms(matrix_us / steps),
        "precision": {k: v / matrix_us for k, v in sorted(by_precision.items(),
                                                          key=lambda kv: -kv[1])}
        if matrix_us else {}}
    evidence.top_kernels = [
        {"name": trace.names[i], "calls": int(calls[i]), "ms": _ms(float(per_name[i])),
         "share_of_busy": float(per_name[i]) / busy_us,
         "kind": kernels.KIND_NAMES[kind_of[i]],
         "tensor_cores": kernels.is_matrix(trace.names[i])
         and kernels.uses_tensor_cores(trace.names[i])}
        for i in np.argsort(-per_name)[:TOP] if calls[i]]


def _region_intervals(trace: RankTrace, region: str) -> iv.Intervals:
    try:
        number = trace.names.index(region)
    except ValueError:
        return iv.EMPTY
    rows = trace.regions.name == number
    return iv.union(trace.regions.start[rows], trace.regions.end[rows])


def _sync_rows(trace: RankTrace) -> list[int]:
    """Runtime calls that hold the host until the GPU catches up: synchronize calls and
    device-to-host copies into pageable memory."""
    rt = trace.runtime
    return [i for i, name in enumerate(trace.name_of(rt.name)) if name in kernels.SYNC_CALLS
            or (name == "cudaMemcpyAsync" and rt.correlation[i] in trace.blocking_copies)]


def _sync_ends(trace: RankTrace, with_starts: bool = False):
    """When each host synchronisation ended (sorted); with its start too for drawing."""
    rows = _sync_rows(trace)
    rt = trace.runtime
    if not rows:
        return (np.zeros(0), np.zeros(0)) if with_starts else np.zeros(0)
    return (rt.start[rows], rt.end[rows]) if with_starts else np.sort(rt.end[rows])
