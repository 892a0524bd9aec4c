"""GPU telemetry and energy: NVML through a simulated board (no GPU here; the `gpu` test reads
a real one), RAPL through a powercap tree on disk, the watchdog, and a whole run's record.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_monitor.py."""

import math
import time

import pytest

from hpctrain.monitor import start as monitor_start
from hpctrain.monitor.gpu import DeviceIdentity, open_gpu, throttle_names
from hpctrain.monitor.rapl import open_rapl
from hpctrain.monitor.meter import (NOT_MEASURED, ROW, Meter, device_key, energy_of,
                                      interval_record, job_means)
from hpctrain.monitor.watchdog import Watchdog

UUID = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"


def sampled(gpu, seconds=0.4, interval=0.02) -> Meter:
    sampler = Meter(gpu, gpu.uuid, interval).start()
    time.sleep(seconds)
    sampler.stop()
    return sampler


def test_the_gpu_is_found_by_uuid_then_by_bus_and_named_when_absent(nvml):
    nvml()
    assert open_gpu(DeviceIdentity(UUID, None, 0)).name == "NVIDIA H100 80GB HBM3"
    assert not open_gpu(DeviceIdentity(None, "00000000:17:00.0", 0)).mig
    missing = open_gpu(DeviceIdentity("ffff", "00000000:99:00.0", 3))
    assert isinstance(missing, str) and "cuda:3" in missing and "ffff" in missing


def test_energy_comes_from_the_boards_counter(nvml):
    nvml(watts=300.0, utilization=80)
    gpu = open_gpu(DeviceIdentity(UUID, None, 0))
    assert gpu.energy_source == "nvml-counter"
    started = time.monotonic()
    sampler = sampled(gpu)
    row = dict(zip(ROW, sampler.take()))
    elapsed = time.monotonic() - started
    # the counter between the first and the last sample: 300 W for (almost) the whole time
    assert 0.8 * 300 * elapsed <= row["job_energy_joules"] <= 300 * elapsed
    assert row["utilization"] == pytest.approx(0.8) and row["power_watts"] == 300
    assert row["memory_used_bytes"] == 3 << 30 and row["temperature_c"] == 61
    assert row["sm_clock_mhz"] == 1755 and throttle_names(int(row["throttle_bits"])) == \
        ["sw_power_cap"]
    # take() ends the window; one without samples repeats the last one
    assert sampler.take()[0] == pytest.approx(0.8)
    assert sampler.take()[ROW.index("job_utilization")] == pytest.approx(0.8)  # the job's stay


def test_without_a_counter_power_is_integrated(nvml):
    nvml(watts=200.0, counter=False)
    gpu = open_gpu(DeviceIdentity(UUID, None, 0))
    assert gpu.energy_source == "nvml-power-integrated"
    sampler = Meter(gpu, gpu.uuid, 0.02).start()
    first = time.monotonic()
    time.sleep(0.3)
    sampler.stop()
    last = time.monotonic()
    joules = sampler.take()[ROW.index("job_energy_joules")]
    assert 200 * (last - first) * 0.7 <= joules <= 200 * (last - first) * 1.05


def test_a_mig_instance_reports_its_memory_and_names_the_shared_board(nvml):
    fake = nvml(mig=True)
    gpu = open_gpu(DeviceIdentity(fake.mig_uuid.removeprefix("MIG-"), None, 0))
    assert gpu.mig and "MIG" in gpu.energy_source and gpu.uuid.startswith("GPU-")
    row = dict(zip(ROW, sampled(gpu, 0.1).take()))
    assert math.isnan(row["utilization"])  # NVML has none for MIG instances
    assert row["memory_used_bytes"] == (3 << 30) // 2 and row["power_watts"] == 250


def test_no_nvml_and_no_rapl_is_not_measured(monkeypatch, tmp_path):
    monkeypatch.setattr(monitor_start, "open_rapl", lambda: open_rapl(tmp_path))
    import torch

    sampler = monitor_start.make_meter(torch.device("cpu"), "node1", True, 1.0)
    assert sampler.energy_source == NOT_MEASURED and "no RAPL package domains" in \
        sampler.why_not
    row = sampler.start().take()
    sampler.stop()
    assert all(math.isnan(x) for x in row) and energy_of([row]) is None


def powercap(root, packages=2, energy=1000, top=2**32):
    for i in range(packages):
        domain = root / f"intel-rapl:{i}"
        (domain / f"intel-rapl:{i}:0").mkdir(parents=True)  # a core sub-domain: not counted
        (domain / "name").write_text(f"package-{i}\n")
        (domain / "energy_uj").write_text(f"{energy}\n")
        (domain / "max_energy_range_uj").write_text(f"{top}\n")
    (root / "intel-rapl-mmio:0").mkdir()
    return [root / f"intel-rapl:{i}" for i in range(packages)]


def test_rapl_sums_the_packages_and_counts_a_wrap(tmp_path):
    first, second = powercap(tmp_path, energy=2**32 - 1_000_000)
    rapl = open_rapl(tmp_path)
    (first / "energy_uj").write_text(f"{2**32 - 500_000}\n")  # +0.5 J
    (second / "energy_uj").write_text("1500000\n")  # wrapped: +1 J to the top, +1.5 J after
    assert rapl.energy_joules() == pytest.approx(3.0)
    (second / "energy_uj").write_text("2500000\n")
    assert rapl.energy_joules() == pytest.approx(4.0)


def test_a_rank_without_a_gpu_reads_the_cpu_packages(monkeypatch, tmp_path):
    (package,) = powercap(tmp_path, packages=1)
    monkeypatch.setattr(monitor_start, "open_rapl", lambda: open_rapl(tmp_path))
    import torch

    sampler = monitor_start.make_meter(torch.device("cpu"), "node1", True, 0.02)
    assert sampler.energy_source == "rapl" and sampler.why_not == "no GPU"
    sampler.start()
    (package / "energy_uj").write_text(f"{1000 + 7_000_000}\n")
    time.sleep(0.1)
    sampler.stop()
    row = dict(zip(ROW, sampler.take()))
    assert row["job_energy_joules"] == pytest.approx(7.0)
    assert row["device_key"] == device_key("rapl:node1")


def test_ranks_sharing_a_device_count_it_once():
    def row(key, joules, utilization=0.5, power=100.0):
        values = dict.fromkeys(ROW, math.nan)
        values.update(device_key=device_key(key), job_energy_joules=joules,
                      job_utilization=utilization, job_power_watts=power,
                      utilization=utilization, memory_used_bytes=1e9, power_watts=power,
                      throttle_bits=0x40)
        return [values[name] for name in ROW]
    rows = [row("rapl:a", 10.0), row("rapl:a", 11.0), row("gpu-1", 5.0, 0.9, 300.0),
            [math.nan] * len(ROW)]
    assert energy_of(rows) == pytest.approx(16.0)  # node a's 11 J once, and the GPU's 5 J
    means = job_means(rows)
    assert means["gpu_utilization_mean"] == pytest.approx((0.5 + 0.5 + 0.9) / 3)
    record = interval_record(rows)
    assert record["utilization"] == [0.5, 0.5, 0.9, None]
    assert record["throttle"][0] == ["hw_thermal_slowdown"] and record["throttle"][3] == []
    assert record["power_watts_total"] == pytest.approx(500.0)
    assert interval_record([[math.nan] * len(ROW)]) is None


def test_the_watchdog_names_the_likely_cause_once_per_low_spell():
    dog = Watchdog(0.5, 3, "small-images")
    said = [dog.observe(u, 0.6) for u in (0.3, 0.2, 0.1, 0.1, 0.9, 0.2, 0.2)]
    assert [s is not None for s in said] == [False, False, True, False, False, False, False]
    assert "input-bound" in said[2] and "hpctrain bench data small-images" in said[2]
    dog = Watchdog(0.5, 2, "lm")
    dog.observe(0.4, 0.01)
    line = dog.observe(0.4, 0.01)
    assert "hpctrain profile lm" in line and "40%" in line
    assert Watchdog(0.5, 1, "x").observe(None, 0.9) is None  # no GPU: nothing to say
