"""One GPU read through NVML (nvidia-ml-py): utilisation, memory, power, temperature, SM clock,
why the clock is held down, and the board's total-energy counter.

Which GPU: the one this process's torch device is, found by its UUID (torch reports it after
CUDA_VISIBLE_DEVICES has been applied, so a Slurm cgroup, a renumbering or a UUID list in
CUDA_VISIBLE_DEVICES all resolve alike), else by its PCI bus id. NVML itself ignores
CUDA_VISIBLE_DEVICES, which is why indices are never used.

A MIG instance: memory is the instance's; utilisation is not reported by NVML for MIG (None);
power, temperature, clock and energy are the whole GPU's, shared with its other instances,
and `energy_source` says so. In a container NVML's process list holds host PIDs, so nothing
here is per process: the figures are the device's, which the rank owns.
"""

from __future__ import annotations

from dataclasses import dataclass

# NVML's clock-event (throttle) reason bits, by the names nvidia-smi prints
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake", 0x100: "display_clocks",
}


def throttle_names(bits: int) -> list[str]:
    """The reasons set in `bits`; idle is not a slowdown worth naming while training."""
    return [name for bit, name in THROTTLE_REASONS.items() if bits & bit and bit != 0x1]


@dataclass(frozen=True)
class DeviceIdentity:
    """What torch says of its device, to find the same one in NVML."""

    uuid: str | None  # as torch prints it, without the GPU-/MIG- prefix
    pci_bus_id: str | None  # "0000:17:00.0"
    index: int  # torch's index, for messages only


@dataclass
class GpuReading:
    utilization: float | None  # 0..1 of the sample period with a kernel running
    memory_used_bytes: int
    power_watts: float | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    throttle_bits: int
    energy_joules: float | None  # the board's counter since it was loaded (None: no counter)


class NvmlGpu:
    """A GPU opened in NVML; `read()` takes one sample (a few NVML calls, no CUDA)."""

    def __init__(self, nvml, handle, board, name: str, uuid: str, mig: bool):
        self.nvml, self.handle, self.board = nvml, handle, board
        self.name, self.uuid, self.mig = name, uuid, mig
        self.has_counter = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption,
                                          board) is not None

    @property
    def energy_source(self) -> str:
        how = "nvml-counter" if self.has_counter else "nvml-power-integrated"
        return f"{how} (whole GPU, shared by its MIG instances)" if self.mig else how

    def _optional(self, call, *args):
        """`call(*args)`, or None where this device does not support it."""
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def read(self) -> GpuReading:
        nvml = self.nvml
        utilization = None if self.mig else self._optional(nvml.nvmlDeviceGetUtilizationRates,
                                                           self.handle)
        power = self._optional(nvml.nvmlDeviceGetPowerUsage, self.board)  # milliwatts
        energy = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, self.board)  # mJ
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return GpuReading(
            utilization=utilization.gpu / 100 if utilization is not None else None,
            memory_used_bytes=int(nvml.nvmlDeviceGetMemoryInfo(self.handle).used),
            power_watts=power / 1000 if power is not None else None,
            temperature_c=self._optional(nvml.nvmlDeviceGetTemperature, self.board,
                                         nvml.NVML_TEMPERATURE_GPU),
            sm_clock_mhz=self._optional(nvml.nvmlDeviceGetClockInfo, self.board,
                                        nvml.NVML_CLOCK_SM),
            throttle_bits=int(self._optional(reasons, self.board) or 0),
            energy_joules=energy / 1000 if energy is not None and self.has_counter else None)


def open_gpu(identity: DeviceIdentity) -> NvmlGpu | str:
    """The NVML view of torch's device, or why there is none (a sentence for the banner)."""
    try:
        import pynvml as nvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        return f"NVML did not start ({err})"
    handle = _find(nvml, identity)
    if handle is None:
        return (f"cuda:{identity.index} (uuid {identity.uuid}, bus {identity.pci_bus_id}) is "
                "not among the GPUs NVML lists")
    mig = bool(_call(nvml, "nvmlDeviceIsMigDeviceHandle", handle))
    board = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if mig else handle
    return NvmlGpu(nvml, handle, board, _text(nvml.nvmlDeviceGetName(board)),
                   _text(nvml.nvmlDeviceGetUUID(board)), mig)


def _find(nvml, identity: DeviceIdentity):
    tries = []
    if identity.uuid:
        bare = identity.uuid.removeprefix("GPU-").removeprefix("MIG-")
        tries += [(nvml.nvmlDeviceGetHandleByUUID, f"GPU-{bare}"),
                  (nvml.nvmlDeviceGetHandleByUUID, f"MIG-{bare}")]
    if identity.pci_bus_id:
        tries.append((nvml.nvmlDeviceGetHandleByPciBusId, identity.pci_bus_id))
    for call, key in tries:
        try:
            return call(key)
        except nvml.NVMLError:
            continue
    return None


def _call(nvml, name: str, *args):
    try:
        return getattr(nvml, name)(*args)
    except (AttributeError, nvml.NVMLError):
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_identity(index: int) -> DeviceIdentity:
    """torch's view of cuda:`index` (needs CUDA)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "") or None
    bus = None
    if hasattr(props, "pci_bus_id"):
        bus = f"{getattr(props, 'pci_domain_id', 0):08x}:{props.pci_bus_id:02x}:" \
              f"{getattr(props, 'pci_device_id', 0):02x}.0"
    return DeviceIdentity(uuid=uuid, pci_bus_id=bus, index=index)
