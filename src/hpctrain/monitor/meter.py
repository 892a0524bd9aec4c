"""Each rank's background meter: its GPU through NVML (or, without one, the node's CPU
packages through RAPL) read every `monitor.interval_seconds` on a thread of its own.

The training step never waits for it: the thread makes NVML calls only (no CUDA, so no
host-device synchronisation), and the loop picks up the figures at its logging intervals,
where it already gathers per-rank timings: `take()` returns one row of floats per rank, and
rank 0 turns the rows into a `gpu` record (`interval_record`) and the run's energy
(`energy_of`). Energy: the board's total-energy counter (Volta and newer) since the meter
started; where there is none, power integrated over the samples (trapezoids).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time

from hpctrain.monitor.gpu import NvmlGpu, throttle_names
from hpctrain.monitor.rapl import RaplPackages

NOT_MEASURED = "not measured"
NAN = math.nan
# one rank's row, as take() returns it and the loop gathers it
ROW = ("utilization", "memory_used_bytes", "power_watts", "temperature_c", "sm_clock_mhz",
       "throttle_bits", "job_utilization", "job_power_watts", "job_energy_joules", "device_key")


def device_key(text: str) -> float:
    """A number naming one device (a GPU's UUID, a node's RAPL), exact in a float64: ranks
    that share a device count its energy once."""
    return float(int(hashlib.sha1(text.encode()).hexdigest()[:12], 16))


class _Mean:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def add(self, value) -> None:
        if value is not None:
            self.total, self.count = self.total + value, self.count + 1

    @property
    def value(self) -> float:
        return self.total / self.count if self.count else NAN


class _Window:
    """What the samples since the last take() say."""

    def __init__(self):
        self.utilization, self.power, self.clock = _Mean(), _Mean(), _Mean()
        self.memory, self.temperature, self.throttle = 0, NAN, 0


class Meter:
    """Samples `source` (an NvmlGpu, RaplPackages or None) until `stop()`."""

    def __init__(self, source: NvmlGpu | RaplPackages | None, key: str, interval: float,
                 why_not: str | None = None):
        self.source, self.interval, self.why_not = source, interval, why_not
        self.key = device_key(key) if source is not None else NAN
        self.energy_source = (source.energy_source if isinstance(source, NvmlGpu)
                              else "rapl" if source is not None else NOT_MEASURED)
        self.lock = threading.Lock()
        self.window, self.job = _Window(), _Window()
        self.counter_start = None
        self.energy = 0.0 if source is not None else None  # joules this job
        self.last_time, self.last_power = None, None
        self.first_sample = self.last_sample = None  # monotonic times: the span measured
        self.stopping = threading.Event()
        self.thread = None
        self.broken = False  # the device stopped answering: no more samples
        if source is not None:
            self._first_sample()

    def _first_sample(self) -> None:
        """The reading energy counts from (taken when the meter is made, before the run
        builds its data and model)."""
        try:
            self.sample()
        except Exception as err:  # NVML refused the device after all: measure nothing
            self.source, self.energy, self.energy_source = None, None, NOT_MEASURED
            self.key = NAN
            self.why_not = f"the first sample failed: {err}"

    def start(self) -> Meter:
        """Sample on a thread of its own from now until stop()."""
        if self.source is None:
            return self
        self.thread = threading.Thread(target=self._run, name="hpctrain-monitor", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping.wait(self.interval) and self._sample_or_say():
            pass

    def _sample_or_say(self) -> bool:
        """One sample; False (and why) when the device stopped answering (a driver gone)."""
        if self.source is None or self.broken:
            return False
        try:
            self.sample()
        except Exception as err:
            self.broken, self.why_not = True, f"sampling stopped: {err}"
            return False
        return True

    def sample(self) -> None:
        """One reading, under the lock: the thread's and a logging interval's never overlap,
        so the samples' times only grow."""
        with self.lock:
            now = time.monotonic()
            self.first_sample = self.first_sample or now
            self.last_sample = now
            if isinstance(self.source, RaplPackages):
                before = self.energy
                self.energy = self.source.energy_joules()
                if self.last_time is not None and now > self.last_time:
                    power = (self.energy - before) / (now - self.last_time)
                    self.window.power.add(power)
                    self.job.power.add(power)
                self.last_time = now
                return
            reading = self.source.read()
            for window in (self.window, self.job):
                self._add_reading(window, reading)
            self._add_energy(reading, now)

    @staticmethod
    def _add_reading(window: _Window, reading) -> None:
        window.utilization.add(reading.utilization)
        window.power.add(reading.power_watts)
        window.clock.add(reading.sm_clock_mhz)
        window.memory = max(window.memory, reading.memory_used_bytes)
        window.throttle |= reading.throttle_bits
        if reading.temperature_c is not None:
            window.temperature = float(reading.temperature_c)

    def _add_energy(self, reading, now: float) -> None:
        if reading.energy_joules is not None:
            if self.counter_start is None:
                self.counter_start = reading.energy_joules
            self.energy = reading.energy_joules - self.counter_start
        elif reading.power_watts is not None:
            if self.last_power is not None:
                self.energy += (now - self.last_time) * (reading.power_watts + self.last_power) / 2
            self.last_time, self.last_power = now, reading.power_watts

    def take(self, new_window: bool = True) -> list[float]:
        """This rank's row (ROW's order, NaN where not measured), with a sample taken now (a
        few NVML calls, at a logging interval: the energy is exact there); the window of
        samples since the last take() ends there unless `new_window` is False."""
        self._sample_or_say()
        with self.lock:
            w, job = self.window, self.job
            seen = w.memory > 0
            row = [w.utilization.value, float(w.memory) if seen else NAN, w.power.value,
                   w.temperature, w.clock.value, float(w.throttle) if seen else NAN,
                   job.utilization.value,
                   job.power.value, NAN if self.energy is None else self.energy, self.key]
            if new_window:
                self.window = _Window()
        return row

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self._sample_or_say()  # the energy up to the end


def _value(x: float):
    return None if math.isnan(x) else x


def add_energy(before: float | None, now: float | None) -> float | None:
    """Joules of the earlier jobs and this one's; None only when neither was measured."""
    return None if before is None and now is None else (before or 0.0) + (now or 0.0)


def energy_of(rows: list[list[float]]) -> float | None:
    """This job's joules over all ranks, each device counted once (None: none measured)."""
    by_device = {}
    for row in rows:
        key, joules = row[ROW.index("device_key")], row[ROW.index("job_energy_joules")]
        if not math.isnan(key) and not math.isnan(joules):
            by_device[key] = max(joules, by_device.get(key, 0.0))
    return sum(by_device.values()) if by_device else None


def job_means(rows: list[list[float]]) -> dict:
    """The job's mean GPU utilisation and power per GPU, over the ranks that measured them."""
    def mean(name):
        values = [r[ROW.index(name)] for r in rows if not math.isnan(r[ROW.index(name)])]
        return sum(values) / len(values) if values else None
    return {"gpu_utilization_mean": mean("job_utilization"),
            "gpu_power_mean_watts": mean("job_power_watts")}


def interval_record(rows: list[list[float]]) -> dict | None:
    """The `gpu` record of one logging interval: per-rank lists, in rank order (None when no
    rank has a GPU to report)."""
    column = {name: [_value(r[i]) for r in rows] for i, name in enumerate(ROW)}
    if all(u is None for u in column["memory_used_bytes"]):
        return None
    utilization = [u for u in column["utilization"] if u is not None]
    power = [p for p in column["power_watts"] if p is not None]
    return {
        "utilization": column["utilization"],
        "memory_used_bytes": [None if m is None else int(m) for m in
                              column["memory_used_bytes"]],
        "power_watts": column["power_watts"],
        "temperature_c": column["temperature_c"],
        "sm_clock_mhz": column["sm_clock_mhz"],
        "throttle": [throttle_names(int(t or 0)) for t in column["throttle_bits"]],
        "utilization_mean": sum(utilization) / len(utilization) if utilization else None,
        "power_watts_total": sum(power) if power else None,
    }
