"""nvidia-ml-py's calls as hpctrain makes them, answered by a simulated GPU: for the machines
without one. The board draws `watts` steadily, so its energy counter (mJ) grows by watts x
seconds of the monotonic clock, as a real board's does."""

from __future__ import annotations

import time
import types


class NVMLError(Exception):
    def __init__(self, value=3):
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(watts: float = 250.0, utilization: int = 80, counter: bool = True,
              mig: bool = False, uuid: str = "GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000001",
              bus: str = "00000000:17:00.0", memory: int = 3 << 30, throttle: int = 0x4):
    started = time.monotonic()
    board, instance = object(), object()
    mig_uuid = "MIG-7f000000-aaaa-bbbb-cccc-000000000009"

    def by_uuid(key):
        if key == uuid:
            return board
        if mig and key == mig_uuid:
            return instance
        raise NVMLError(13)

    def by_bus(key):
        if key == bus:
            return instance if mig else board
        raise NVMLError(13)

    def on_board(handle):
        if handle is not board:
            raise NVMLError(NOT_SUPPORTED)

    def energy(handle):
        on_board(handle)
        if not counter:
            raise NVMLError(NOT_SUPPORTED)
        return int(1_000_000 + watts * (time.monotonic() - started) * 1000)

    def power(handle):
        on_board(handle)
        return int(watts * 1000)

    def util(handle):
        if handle is instance:
            raise NVMLError(NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=utilization, memory=30)

    NOT_SUPPORTED = 3
    module = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_ERROR_NOT_SUPPORTED=NOT_SUPPORTED, NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1, calls=[],
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=by_uuid, nvmlDeviceGetHandleByPciBusId=by_bus,
        nvmlDeviceIsMigDeviceHandle=lambda h: int(h is instance),
        nvmlDeviceGetDeviceHandleFromMigDeviceHandle=lambda h: board,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: uuid,
        nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=memory // (2 if h is
                                                                               instance else 1)),
        nvmlDeviceGetPowerUsage=power, nvmlDeviceGetTotalEnergyConsumption=energy,
        nvmlDeviceGetTemperature=lambda h, sensor: 61,
        nvmlDeviceGetClockInfo=lambda h, clock: 1755,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: throttle,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: throttle,
    )
    module.mig_uuid = mig_uuid
    return module
