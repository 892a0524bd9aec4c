"""`hpctrain bench node` on the CPU: every CPU row in its unit, the all-reduce between two
gloo processes as nccl-tests' bus bandwidth, the results kept per host.

Here the tests that need no training run, no process and no server; the others are
tests/cluster/test_bench_node.py."""

import json

import pytest

from hpctrain.bench.node import bus_bandwidth
from hpctrain.runs.directory import node_limits_path

QUICK = ["--size", "256", "--megabytes", "16", "--seconds", "0.05"]


def test_bus_bandwidth_is_nccl_tests_definition():
    # 1 GB in 0.5 s: algorithm bandwidth 2 GB/s; a ring of 4 carries 2 x 3/4 of it per link
    assert bus_bandwidth(10 ** 9, 0.5, 4) == pytest.approx(3e9)
    assert bus_bandwidth(10 ** 9, 0.5, 2) == pytest.approx(2e9)  # 2(n-1)/n = 1


def test_bench_node_measures_what_the_cpu_has(run_cli, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x" * 3_000_000)
    code, out, err = run_cli("bench", "node", *QUICK, "--data", str(data), "--json")
    assert code == 0, err
    report = json.loads(out)
    rows = {(r["group"], r["name"]): r for r in report["rows"]}
    for dtype in ("fp64", "fp32", "bf16"):
        assert rows[("matmul", dtype)]["unit"] == "TFLOP/s" and rows[("matmul", dtype)]["value"] > 0
    assert ("matmul", "fp8") not in rows and not any(g == "transfer" for g, _ in rows)
    assert rows[("memory", "copy")]["unit"] == "GB/s" and rows[("memory", "copy")]["value"] > 0
    decode = rows[("decode", "JPEG, PIL, one core")]
    assert decode["unit"] == "images/s" and decode["value"] > 10
    read = rows[("read", str(data))]
    assert read["unit"] == "GB/s" and read["note"].startswith("3 MB from 1 file")
    assert json.loads(node_limits_path().read_text())["rows"] == report["rows"]
    code, out, _ = run_cli("bench", "node", *QUICK)
    assert code == 0 and "no GPU, the CPU measured" in out and "TFLOP/s" in out


def test_bench_node_refuses_a_missing_path(run_cli, tmp_path):
    code, _, err = run_cli("bench", "node", *QUICK, "--data", str(tmp_path / "none"))
    assert code == 2 and "no such file or folder" in err


def test_mfu_divides_by_the_measured_peak_where_the_node_has_one(run_cli):
    from hpctrain.train.hardware.mfu import measured_flops, peak_flops, spec_flops

    code, out, err = run_cli("bench", "node", *QUICK, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["device"] == "cpu"  # as a run's plan names this device
    (fp32,) = [r for r in report["rows"] if r["group"] == "matmul" and r["name"] == "fp32"]
    assert measured_flops("cpu", "fp32") == peak_flops("cpu", "fp32") == fp32["value"] * 1e12
    assert spec_flops("cpu", "fp32") is None  # no spec sheet for a CPU
    assert measured_flops("NVIDIA A100-SXM4-40GB", "bf16") is None  # measured another device
    assert peak_flops("NVIDIA A100-SXM4-40GB", "bf16") == spec_flops(
        "NVIDIA A100-SXM4-40GB", "bf16") == 312e12
    assert spec_flops("NVIDIA H100 80GB HBM3", "fp8") == 1979e12


def test_bench_node_refuses_a_time_that_is_not_positive(run_cli):
    with pytest.raises(SystemExit) as stop:
        run_cli("bench", "node", "--seconds", "0")
    assert stop.value.code == 2


def test_each_multiply_is_sized_by_time_not_by_a_fixed_side():
    """A dtype the device runs slowly (bf16 on this CPU: 60 s a call at 2048) is measured at
    the side where one call takes under a sixteenth of the row's time; a fast one reaches the
    largest side asked for."""
    import time

    import torch

    from hpctrain.bench.node import time_sized

    def slow(side: int):  # 10 ms at 256: a call 8 times longer each doubling
        return lambda: time.sleep(0.01 * (side / 256) ** 3)

    cpu = torch.device("cpu")
    assert time_sized(slow, cpu, 0.1, 2048)[0] == 256  # 10 ms > 0.1 / 16: no doubling
    assert time_sized(slow, cpu, 0.4, 2048)[0] == 512  # 10 ms < 0.4 / 16; 80 ms is not
    assert time_sized(lambda side: lambda: None, cpu, 0.05, 2048)[0] == 2048
    assert time_sized(lambda side: lambda: None, cpu, 0.05, 100)[0] == 100
