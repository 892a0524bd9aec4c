"""The named step regions in a real torch.profiler trace, read back by the streaming reader."""

import gzip
import json
from collections import Counter

import pytest
import torch.profiler as profiler

from hpctrain.profiling.names import PREFIX, REGIONS
from hpctrain.profiling.trace import TraceError, iter_events
from hpctrain.train import loop
from hpctrain.train.bookkeeping import Clock
from hpctrain.train.build import build_parts
from hpctrain.train.loop import Progress, _run_steps
from hpctrain.train.preemption import Stopper
from hpctrain.train.telemetry import Telemetry


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory, shapes_cache):
    """Four training steps of a tiny run under torch.profiler, as gzip JSON."""
    from hpctrain.config import load_config

    out = tmp_path_factory.mktemp("trace")
    config = load_config("default", [
        f"output_dir={out / 'runs'}", f"data.shapes.cache_dir={shapes_cache}",
        "data.shapes.num_train=160", "data.shapes.num_val=40", "data.shapes.image_size=16",
        "data.images.image_size=16", "data.num_workers=0", "model.name=hpctrain:tiny_cnn",
        "train.batch_size=16", "train.max_steps=4", "tensorboard=false"])
    parts = build_parts(config)
    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    saved = loop.run_record.save_checkpoint
    loop.run_record.save_checkpoint = lambda *a: None  # checkpoints are not what is looked at here
    try:
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
            _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed))
    finally:
        loop.run_record.save_checkpoint = saved
        telemetry.close()
    plain = out / "trace.json"
    prof.export_chrome_trace(str(plain))
    compressed = out / "trace.json.gz"
    compressed.write_bytes(gzip.compress(plain.read_bytes()))
    return plain, compressed


def test_every_step_region_is_in_the_trace(trace_file):
    plain, compressed = trace_file
    names = Counter(e["name"] for e in iter_events(compressed)
                    if e.get("name", "").startswith(PREFIX))
    assert names == {PREFIX + region: 4 for region in REGIONS}


@pytest.mark.parametrize("chunk", [5, 4096, 1 << 20])
def test_streaming_reads_exactly_what_json_load_reads(trace_file, chunk):
    plain, compressed = trace_file
    expected = json.loads(plain.read_text())["traceEvents"]
    assert list(iter_events(plain, chunk=chunk)) == expected
    assert list(iter_events(compressed, chunk=chunk)) == expected


def test_damaged_traces_are_named(trace_file, tmp_path):
    plain, _ = trace_file
    text = plain.read_text()
    (tmp_path / "cut.json").write_text(text[:len(text) // 2])
    with pytest.raises(TraceError, match="truncated|damaged"):
        list(iter_events(tmp_path / "cut.json"))
    (tmp_path / "other.json").write_text('{"events": []}')
    with pytest.raises(TraceError, match="has no traceEvents array"):
        list(iter_events(tmp_path / "other.json"))
    with pytest.raises(TraceError, match="does not exist"):
        list(iter_events(tmp_path / "missing.json"))


def _columns(trace) -> dict:
    """Every column of a collected trace, names spelled out (piece-wise ids differ)."""
    from hpctrain.profiling.collect import RankTrace
    tables = {}
    for table in ("steps", "regions", "ops", "python", "runtime", "gpu"):
        columns = getattr(trace, table)
        tables[table] = {column: (trace.name_of(getattr(columns, column)) if column == "name"
                                  else getattr(columns, column).tolist())
                         for column in columns._arrays}
    assert isinstance(trace, RankTrace)
    return {"tables": tables, "matrix_ops": trace.matrix_ops, "copies": trace.blocking_copies,
            "memory": trace.peak_memory, "main_tid": trace.main_tid, "rank": trace.rank}


@pytest.fixture(scope="module")
def plain_gpu_trace(tmp_path_factory):
    """A generated two-stream GPU trace of 12 steps, uncompressed (so it can be cut)."""
    from kineto_synth import SCENARIOS, write_trace
    compressed = tmp_path_factory.mktemp("gpu") / "rank-0.json.gz"
    write_trace(compressed, SCENARIOS["exposed_communication"][0], 12)
    plain = compressed.with_name("rank-0.json")
    plain.write_bytes(gzip.decompress(compressed.read_bytes()))
    return plain, compressed


@pytest.mark.parametrize("processes", [2, 3])
def test_a_trace_read_in_pieces_is_the_trace_read_whole(trace_file, plain_gpu_trace,
                                                        processes):
    """Plain or gzip-compressed, the pieces tile the trace: their events are its events, and
    the columns collected by several processes are the columns collected by one."""
    from hpctrain.profiling.collect import collect
    from hpctrain.profiling.trace import part_ranges
    for path in (*trace_file, *plain_gpu_trace):
        least = len(gzip.decompress(path.read_bytes()) if path.suffix == ".gz"
                    else path.read_bytes()) // (processes + 1)
        parts = part_ranges(path, processes, least)
        assert len(parts) == processes and parts[-1][1] is None
        assert [event for part in parts for event in iter_events(path, part=part)] \
            == list(iter_events(path))
    for path in plain_gpu_trace:
        whole = collect(path, processes=1)
        assert _columns(collect(path, processes=processes, part_bytes=least)) \
            == _columns(whole)
        assert len(whole.gpu) > 100 and len(whole.steps) == 12


def _steps(count: int) -> list[dict]:
    return [event for step in range(count) for event in (
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "tid": 1,
         "ts": step * 100.0, "dur": 90.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": step * 100.0 + 1,
         "dur": 50.0, "args": {"Input Dims": [[8, 8], [8, 8]], "Input type": ["float"] * 2}})]


def test_a_cut_in_the_wrong_place_is_found_out_and_the_trace_read_whole(tmp_path):
    """Where the only lines opening with `{` are inside events, the piece before a cut ends
    inside an event; where no line opens with `{` near a cut, there is no cut. Either way
    the whole file is read instead: the same columns."""
    from hpctrain.profiling.collect import collect
    from hpctrain.profiling.trace import part_ranges
    nested = tmp_path / "nested.json"
    nested.write_text('{"traceEvents": [' + ", ".join(
        json.dumps(event).replace('"args": ', '"args":\n') for event in _steps(400)) + "]}")
    one_line = tmp_path / "one_line.json"
    one_line.write_text(json.dumps({"traceEvents": _steps(400)}))
    for path in (nested, one_line):
        least = path.stat().st_size // 4
        with pytest.raises(TraceError, match="inside an event|damaged event|no line opens"):
            list(iter_events(path, part=part_ranges(path, 3, least)[0]))
        whole = collect(path, processes=1)
        assert _columns(collect(path, processes=3, part_bytes=least)) == _columns(whole)
        assert whole.matrix_ops[("aten::mm", ((8, 8), (8, 8)), "float")] == [400, 20000.0]


def test_a_damaged_trace_read_in_pieces_is_named_as_when_read_whole(plain_gpu_trace,
                                                                    tmp_path):
    from hpctrain.profiling.collect import collect
    plain, _ = plain_gpu_trace
    text = plain.read_text()
    damaged = tmp_path / "damaged.json"
    damaged.write_text(text[:len(text) * 3 // 4] + "\n]}")
    with pytest.raises(TraceError) as whole:
        collect(damaged, processes=1)
    with pytest.raises(TraceError) as pieces:
        collect(damaged, processes=2, part_bytes=len(text) // 3)
    assert str(pieces.value) == str(whole.value)
