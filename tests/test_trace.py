"""The named step regions in a real torch.profiler trace, read back by the streaming reader."""

import gzip
import json
from collections import Counter

import pytest
import torch.profiler as profiler

from hpctrain.profiling.names import PREFIX, REGIONS
from hpctrain.profiling.trace import TraceError, iter_events
from hpctrain.train import loop
from hpctrain.train.build import build_parts
from hpctrain.train.bookkeeping import Clock
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
        "data.image_size=16", "data.num_workers=0", "model.name=hpctrain:tiny_cnn",
        "train.batch_size=16", "train.max_steps=4", "tensorboard=false"])
    parts = build_parts(config)
    telemetry = Telemetry(parts.run_dir, parts.total_steps, 0)
    saved = loop._save
    loop._save = lambda *a: None  # checkpoints are not what is looked at here
    try:
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU]) as prof:
            _run_steps(parts, Progress(), Clock(), telemetry, Stopper(parts.distributed))
    finally:
        loop._save = saved
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
