"""How fast, and in how much memory, `hpctrain profile --trace` analyses a large trace.

Generates a GPU trace of at least --megabytes (plain JSON, launch-bound steps with Python
frames, written by tests/kineto_synth.py in constant memory), then, each in a fresh process
so that peak memory is the process's own:
  (a) baseline: json.load of the file, the first line of every hand-written analysis script
      (and of Holistic Trace Analysis's parser), doing nothing else;
  (b) hpctrain: the whole analysis (streamed collection, evidence, verdict), one process;
  (c) the same with hpctrain's default: a piece of the trace per core;
  (d) (c) on the same trace gzip-compressed.
Prints seconds and the largest process's peak resident memory, and the ratios.

With --hta PYTHON (an interpreter where HolisticTraceAnalysis is installed), it also runs
HTA's temporal breakdown and idle-time breakdown on three small generated GPU traces, or on
the recorded ones given with --trace, and prints them beside ours: the two must agree within
2 percentage points.

    python benchmarks/trace_analysis.py --megabytes 500
    python benchmarks/trace_analysis.py --megabytes 50 --hta /tmp/htavenv/bin/python
    python benchmarks/trace_analysis.py --megabytes 0 --hta PYTHON \
        --trace runs/default-.../profile/rank-0.json.gz      # a trace recorded on a GPU
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from hpctrain.profiling.collect import PART_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kineto_synth import SCENARIOS, Synth, write_trace  # noqa: E402

_MEASURE = """
import json, resource, sys, time
start = time.perf_counter()
{body}
peaks = [resource.getrusage(who).ru_maxrss / 1024
         for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps({{"seconds": time.perf_counter() - start, "peak_mb": max(peaks)}}))
"""
BASELINE = "events = json.load(open(sys.argv[1]))['traceEvents']"
HPCTRAIN = textwrap.dedent("""
    from hpctrain.profiling.analysis import analyse
    from hpctrain.profiling.collect import collect
    from hpctrain.profiling.verdict import decide
    verdict = decide([analyse(collect(sys.argv[1], processes={processes},
                                      part_bytes={part_bytes}))])
    print(verdict.bound, file=sys.stderr)
""")


def big_step(synth: Synth, rank: int) -> None:
    """A launch-bound step whose every operator sits under a few Python frames."""
    from kineto_synth import ELEMENTWISE
    with synth.region("data_wait"):
        synth.work(200.0)
    for region, count in (("forward", 300), ("backward", 600), ("optimizer", 100)):
        with synth.region(region):
            for i in range(count):
                with synth.span("python_function", f"model.py({40 + i % 50}): forward"), \
                        synth.span("python_function", "torch/nn/modules/module.py(1751): "
                                   "_call_impl"), \
                        synth.op("aten::add", 10.0, dims=[[64, 256], [64, 256]]):
                    synth.work(10.0)
                    synth.launch(ELEMENTWISE, 3.0)


def generate(path: Path, megabytes: float) -> int:
    """Write steps until the file passes `megabytes`; the number of steps."""
    steps = 0
    with open(path, "w") as out:
        out.write('{"schemaVersion": 1, "traceEvents": [\n')
        synth = Synth(out)
        while out.tell() < megabytes * 1e6:
            with synth.step(steps):
                big_step(synth, 0)
            steps += 1
        out.write("\n]}\n")
    return steps


def measure(body: str, trace: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", _MEASURE.format(body=body), str(trace)],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


HTA_SCRIPT = textwrap.dedent("""
    import json, sys
    from hta.trace_analysis import TraceAnalysis
    analyzer = TraceAnalysis(trace_dir=sys.argv[1])
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    idle = analyzer.get_idle_time_breakdown(visualize=False, show_idle_interval_stats=False)
    idle = idle[0] if isinstance(idle, tuple) else idle
    print(json.dumps({"temporal": temporal.to_dict(orient="records"),
                      "idle": idle.to_dict(orient="records")}))
""")


def generated_traces(scratch: Path) -> list[Path]:
    """Three GPU patterns, 6 steps each, one folder per trace (HTA reads a folder)."""
    traces = []
    for name in ("sync_bound", "launch_bound", "exposed_communication"):
        (scratch / name).mkdir()
        traces.append(scratch / name / "rank-0.json.gz")
        write_trace(traces[-1], SCENARIOS[name][0], 6, rank=0, world_size=1)
    return traces


def recorded_traces(paths: list[str], scratch: Path) -> list[Path]:
    """Each recorded trace copied alone into a folder of its own, for HTA."""
    traces = []
    for index, path in enumerate(map(Path, paths)):
        folder = scratch / f"{index}:{path.name}"  # the folder names the trace's row
        folder.mkdir()
        traces.append(folder / path.name)
        shutil.copyfile(path, traces[-1])
    return traces


def compare_with_hta(python: str, traces: list[Path]) -> None:
    """HTA's and our temporal and idle breakdowns, side by side."""
    from hpctrain.profiling.analysis import analyse
    from hpctrain.profiling.collect import collect

    print("\n| trace | figure | HTA | hpctrain | difference (points) |\n|---|---|---|---|---|")
    for trace in traces:
        name, folder = trace.parent.name, trace.parent
        ours = analyse(collect(trace))
        result = subprocess.run([python, "-c", HTA_SCRIPT, str(folder)], capture_output=True,
                                text=True)
        if result.returncode != 0:
            print(f"| {name} | HTA failed: {result.stderr.strip().splitlines()[-1]} | | | |")
            continue
        hta = json.loads(result.stdout.strip().splitlines()[-1])
        row = hta["temporal"][0]
        total = row["idle_time(us)"] + row["compute_time(us)"] + row["non_compute_time(us)"]
        pairs = [("idle share", row["idle_time(us)"] / total, ours.temporal["idle"]),
                 ("compute share", row["compute_time(us)"] / total, ours.temporal["compute"]),
                 ("non-compute share", row["non_compute_time(us)"] / total,
                  ours.temporal["non_compute"])]
        idle_total = sum(r["idle_time"] for r in hta["idle"]) or 1.0
        for category in ("host_wait", "kernel_wait", "other"):
            theirs = sum(r["idle_time"] for r in hta["idle"]
                         if r["idle_category"] == category) / idle_total
            pairs.append((f"idle: {category}", theirs, ours.idle[category]))
        for figure, theirs, mine in pairs:
            print(f"| {name} | {figure} | {theirs:.1%} | {mine:.1%} | "
                  f"{100 * (mine - theirs):+.1f} |")


def time_big_trace(trace: Path, megabytes: float, part_bytes: int) -> None:
    """(a) to (d) on a generated trace of `megabytes`, each in a fresh process."""
    started = time.perf_counter()
    steps = generate(trace, megabytes)
    size = trace.stat().st_size / 1e6
    print(f"generated {size:,.0f} MB, {steps} steps in {time.perf_counter() - started:.0f} s")
    baseline = measure(BASELINE, trace)
    one = measure(HPCTRAIN.format(processes=1, part_bytes=part_bytes), trace)
    ours = measure(HPCTRAIN.format(processes=None, part_bytes=part_bytes), trace)
    compressed = trace.with_suffix(".json.gz")
    with open(trace, "rb") as plain, gzip.open(compressed, "wb", compresslevel=1) as out:
        shutil.copyfileobj(plain, out)
    zipped = measure(HPCTRAIN.format(processes=None, part_bytes=part_bytes), compressed)
    cores = len(os.sched_getaffinity(0))
    print("\n| reader | seconds | peak memory of one process (MB) | / trace size |\n"
          "|---|---|---|---|")
    for name, row in (("(a) json.load alone", baseline),
                      ("(b) hpctrain analysis, one process", one),
                      (f"(c) hpctrain analysis, {cores} processes (the default)", ours),
                      ("(d) the same, the trace gzip-compressed", zipped)):
        print(f"| {name} | {row['seconds']:.1f} | {row['peak_mb']:,.0f} | "
              f"{row['peak_mb'] / size:.2f} |")
    print(f"\n(c)/(a): time {ours['seconds'] / baseline['seconds']:.2f}x, "
          f"peak memory {ours['peak_mb'] / baseline['peak_mb']:.2f}x; "
          f"(c)/(b): time {ours['seconds'] / one['seconds']:.2f}x; "
          f"pieces of at least {part_bytes / 1e6:.1f} MB")
    trace.unlink()
    compressed.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=500,
                        help="size of the generated trace to time (0: none)")
    parser.add_argument("--part-megabytes", type=float, default=PART_BYTES / 1e6,
                        help="the least piece a process reads (hpctrain's default: %(default)g)")
    parser.add_argument("--hta", metavar="PYTHON", help="an interpreter with HTA installed")
    parser.add_argument("--trace", action="append", default=[],
                        help="a recorded trace to compare with HTA (repeatable)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        if args.megabytes > 0:
            time_big_trace(Path(scratch) / "big.json", args.megabytes,
                           int(args.part_megabytes * 1e6))
        if args.hta:
            compare_with_hta(args.hta, recorded_traces(args.trace, Path(scratch))
                             if args.trace else generated_traces(Path(scratch)))


if __name__ == "__main__":
    main()
