"""GPU telemetry and energy: the tests that train, in this process or in an `hpctrain` process
of their own (the others are tests/unit/test_monitor.py)."""

import json

import pytest

from hpctrain.monitor import start as monitor_start
from hpctrain.monitor.gpu import DeviceIdentity

UUID = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"


def test_a_run_records_its_gpu_and_energy(tmp_path, run_cli, tiny, nvml, monkeypatch):
    """A whole run with the simulated board: gpu records per interval, TensorBoard scalars, the
    watchdog's line, energy in the summary, accumulated through the checkpoint on resume."""
    nvml(watts=400.0, utilization=20)
    monkeypatch.setattr(monitor_start, "device_identity",
                        lambda device: DeviceIdentity(UUID, None, 0))
    settings = tiny("train.max_steps=8", "train.log_every=2", "monitor.interval_seconds=0.05",
                    "monitor.low_intervals=2", "tensorboard=true", "run_name=energy",
                    "--json")
    code, out, _ = run_cli("run", "default", *settings)
    assert code == 0
    run = tmp_path / "runs" / "energy"
    first = json.loads((run / "summary.json").read_text())
    assert first["energy_source"] == "nvml-counter"
    assert first["gpu_utilization_mean"] == pytest.approx(0.2)
    assert first["gpu_power_mean_watts"] == pytest.approx(400.0)
    # the counter, from the moment the device was chosen to the end: almost all of the job
    assert 0.6 * 400 * first["job_seconds"] < first["energy_joules"] < 400 * first["job_seconds"]
    assert first["energy_kwh"] == pytest.approx(first["energy_joules"] / 3.6e6)
    assert first["samples_per_joule"] == pytest.approx(8 * 16 / first["energy_joules"])
    assert "GPU utilisation 20%" in out and ("hpctrain profile default" in out or
                                             "hpctrain bench data default" in out)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    gpus = [r for r in records if r["kind"] == "gpu"]
    assert [r["step"] for r in gpus] == [2, 4, 6, 8]
    assert gpus[-1]["utilization"] == [pytest.approx(0.2)] and gpus[-1]["throttle"] == \
        [["sw_power_cap"]]
    assert gpus[-1]["memory_used_bytes"] == [3 << 30] and len(gpus[-1]["step_seconds"]) == 1
    energies = [r["energy_joules"] for r in gpus]
    assert energies == sorted(energies) and energies[0] > 0
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals[-1]["energy_joules"] > 0 and evals[-1]["elapsed_seconds"] > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb")).Reload()
    assert "gpu/utilization_mean" in events.Tags()["scalars"]

    code, _, _ = run_cli("run", "default", *settings, "train.max_steps=12", "resume=auto")
    assert code == 0
    second = json.loads((run / "summary.json").read_text())
    # the first job's joules (up to its checkpoint) came back through the checkpoint
    assert second["energy_joules"] > first["energy_joules"] * 0.9 + 0.6 * 400 * \
        second["job_seconds"]
    assert second["samples_per_joule"] == pytest.approx(12 * 16 / second["energy_joules"])


def test_top_shows_a_running_runs_ranks_from_its_run_directory(tmp_path, tiny_config, nvml,
                                                               monkeypatch, run_cli, capsys):
    """`hpctrain top` while a run trains (here, from within its step callback): the run's
    latest gpu record, per rank, read from metrics.jsonl."""
    from hpctrain.train.loop import train

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # only this test's runs
    nvml(watts=350.0, utilization=90)
    monkeypatch.setattr(monitor_start, "device_identity",
                        lambda device: DeviceIdentity(UUID, None, 0))
    seen = []

    def look(parts, step):
        if step == 4:
            capsys.readouterr()  # what the run printed so far
            seen.append(run_cli("top", "--once", "--json", "--db", str(tmp_path / "i.sqlite"),
                                "--root", str(parts.run_dir.parent)))
            seen.append(run_cli("top", "--once", "--db", str(tmp_path / "i.sqlite")))
    train(tiny_config("train.max_steps=6", "monitor.interval_seconds=0.05", "run_name=seen"),
          on_step=look)
    (code, out, _), (_, table, _) = seen
    (rank,) = json.loads(out)
    assert code == 0 and rank["run"] == "seen" and rank["step"] == 4
    assert rank["utilization"] == pytest.approx(0.9) and rank["power_watts"] == 350
    assert rank["memory_used_bytes"] == 3 << 30 and 0 <= rank["data_wait_fraction"] <= 1
    assert "1 running run(s)" in table and "90%" in table and "350 W" in table
    capsys.readouterr()
    code, out, _ = run_cli("top", "--once", "--json", "--db", str(tmp_path / "i.sqlite"))
    assert json.loads(out) == []  # finished: no longer running
