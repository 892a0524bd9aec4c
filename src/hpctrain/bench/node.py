"""`hpctrain bench node`: this node's limits, measured rather than read off a spec sheet.

- matrix multiplies per dtype, as TFLOP/s and as a share of the spec (GPU: fp64, fp32, tf32,
  bf16, fp16, and fp8 through torch._scaled_mm where the device has it; CPU: fp64, fp32,
  bf16), each sized by time: the side doubles from 128 up to --size while one multiply takes
  under a sixteenth of the row's time, so a dtype the device runs slowly is measured at a
  smaller side instead of for minutes (bf16 at 2048 took 60 s a call on a 2-core CPU);
- memory bandwidth (a large copy: bytes read plus bytes written); on a GPU also host to
  device and back, from pinned and from pageable memory;
- all-reduce bus bandwidth between the launch's processes (NCCL between GPUs, gloo between
  CPU processes), as nccl-tests defines it: algorithm bandwidth (bytes / time) x 2(n-1)/n;
- JPEG decoding per core (a 500 x 375 photograph-like image at quality 90), and the read
  bandwidth of a path (--data).
The results are kept per host (XDG_STATE_HOME/hpctrain/node/HOST.json).
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hpctrain.bench.timing import per_call, synchronize
from hpctrain.runs.directory import node_limits_path
from hpctrain.writers import write_whole


@dataclass
class Row:
    group: str  # matmul | memory | transfer | all-reduce | decode | read
    name: str
    value: float
    unit: str
    spec: float | None = None  # the spec sheet's figure in the same unit, where known
    note: str = ""

    @property
    def share(self) -> float | None:
        return self.value / self.spec if self.spec else None

    def to_json(self) -> dict:
        return {**asdict(self), "share_of_spec": self.share}


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth (bytes/s): algbw = bytes / time, times 2(n-1)/n,
    the share of the data each link carries in a ring, so that figures compare with the
    link's speed whatever the number of ranks."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks


def matmul_rows(device: torch.device, size: int, seconds: float) -> list[Row]:
    from hpctrain.train.hardware.mfu import spec_flops

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dtypes = [("fp64", torch.float64), ("fp32", torch.float32), ("bf16", torch.bfloat16)]
    if device.type == "cuda":
        dtypes.insert(2, ("tf32", torch.float32))
        dtypes.append(("fp16", torch.float16))
    rows = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for label, dtype in dtypes:
            torch.backends.cuda.matmul.allow_tf32 = label == "tf32"

            def multiply(side: int, dtype=dtype):
                a = torch.randn(side, side, device=device).to(dtype)
                b = torch.randn(side, side, device=device).to(dtype)
                return lambda: a @ b
            side, spent = time_sized(multiply, device, seconds, size)
            spec = spec_flops(name, label)
            rows.append(Row("matmul", label, 2 * side ** 3 / spent / 1e12, "TFLOP/s",
                            spec / 1e12 if spec else None, f"{side} x {side}"))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    fp8 = _fp8_row(device, size, seconds, name)
    return rows + ([fp8] if fp8 else [])


SMALLEST_SIDE = 128


def time_sized(make, device: torch.device, seconds: float, largest: int) -> tuple[int, float]:
    """(side, seconds per call) of the call `make(side)` returns: the side doubled from 128
    (or `largest`, if smaller) while one call takes under a sixteenth of `seconds` (the next,
    8 times the work, then stays within half of it), up to `largest`; then timed for about
    `seconds`."""
    side = min(SMALLEST_SIDE, largest)
    while True:
        run = make(side)
        run()  # the first call: allocation, thread pools, kernel selection
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        once = time.perf_counter() - start
        if side * 2 > largest or once * 16 > seconds:
            return side, per_call(run, device, seconds, least=2)
        side *= 2


def _fp8_row(device: torch.device, size: int, seconds: float, name: str) -> Row | None:
    """e4m3 x e4m3 with tensorwise scales through torch._scaled_mm: Hopper and Ada (8.9+)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return None
    from hpctrain.train.hardware.mfu import spec_flops

    one = torch.tensor(1.0, device=device)

    def multiply(side: int):
        a = torch.randn(side, side, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(side, side, device=device).to(torch.float8_e4m3fn).t()  # column-major
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16)
    side, spent = time_sized(multiply, device, seconds, size)
    spec = spec_flops(name, "fp8")
    return Row("matmul", "fp8", 2 * side ** 3 / spent / 1e12, "TFLOP/s",
               spec / 1e12 if spec else None, f"{side} x {side}, e4m3, tensorwise scales")


def memory_rows(device: torch.device, megabytes: int, seconds: float) -> list[Row]:
    count = megabytes * 2 ** 20 // 4
    source = torch.ones(count, device=device)
    target = torch.empty_like(source)
    spent = per_call(lambda: target.copy_(source), device, seconds)
    rows = [Row("memory", "device copy" if device.type == "cuda" else "copy",
                2 * source.nbytes / spent / 1e9, "GB/s", note=f"{megabytes} MB read + written")]
    if device.type == "cuda":
        for pinned in (True, False):
            host = torch.ones(count, pin_memory=pinned)
            kind = "pinned" if pinned else "pageable"
            up = per_call(lambda: target.copy_(host, non_blocking=pinned), device, seconds)
            down = per_call(lambda: host.copy_(source, non_blocking=pinned), device, seconds)
            rows += [Row("transfer", f"host to device, {kind}", host.nbytes / up / 1e9, "GB/s"),
                     Row("transfer", f"device to host, {kind}", host.nbytes / down / 1e9,
                         "GB/s")]
    return rows


def all_reduce_rows(device: torch.device, megabytes: int, seconds: float) -> list[Row]:
    """Bus bandwidth of an all-reduce among the launch's processes (none alone)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2:
        return []
    ranks = dist.get_world_size()
    tensor = torch.ones(megabytes * 2 ** 20 // 4, device=device)
    spent = max(_gather(_collective_per_call(lambda: dist.all_reduce(tensor), device,
                                             seconds)))  # the slowest rank's, as nccl-tests
    return [Row("all-reduce", f"{dist.get_backend()} x {ranks}",
                bus_bandwidth(tensor.nbytes, spent, ranks) / 1e9, "GB/s",
                note=f"bus bandwidth, {megabytes} MB fp32")]


def _collective_per_call(run, device: torch.device, seconds: float) -> float:
    """Seconds per call of the collective `run`, called the same number of times on every
    rank (the most any rank's estimate asks for): per_call's own clock would let one rank
    stop a call earlier than another, which then waits in it forever (seen under load)."""
    run()
    synchronize(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    calls = max(_gather(max(3, round(seconds / (time.perf_counter() - start)))))
    start = time.perf_counter()
    for _ in range(calls):
        run()
    synchronize(device)
    return (time.perf_counter() - start) / calls


def _gather(value: float) -> list[float]:
    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def decode_rows(seconds: float) -> list[Row]:
    """JPEG decodes per second on one core: PIL's (and simplejpeg's when installed)."""
    import numpy as np
    from PIL import Image

    generator = np.random.default_rng(0)  # gradients plus grain: about a photograph's bytes
    smooth = np.cumsum(generator.integers(-3, 4, (375, 500, 3)), axis=1)
    pixels = (smooth - smooth.min()) * 255 / max(1, smooth.max() - smooth.min())
    pixels = np.clip(pixels + generator.normal(0, 16, pixels.shape), 0, 255)
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    data = buffer.getvalue()
    note = f"500 x 375, quality 90, {len(data) // 1024} KB"
    cpu = torch.device("cpu")
    rows = [Row("decode", "JPEG, PIL, one core",
                1 / per_call(lambda: Image.open(io.BytesIO(data)).convert("RGB").load(), cpu,
                           seconds), "images/s", note=note)]
    try:
        import simplejpeg
    except ImportError:
        return rows
    return rows + [Row("decode", "JPEG, simplejpeg, one core",
                       1 / per_call(lambda: simplejpeg.decode_jpeg(data), cpu, seconds),
                       "images/s", note=note)]


def read_rows(path: Path, limit_bytes: int = 2 ** 30) -> list[Row]:
    """Sequential read bandwidth of the files under `path` (up to 1 GiB; the page cache may
    hold them: a second run reads from memory)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    total, start = 0, time.perf_counter()
    for file in files:
        with open(file, "rb", buffering=0) as handle:
            while chunk := handle.read(16 * 2 ** 20):
                total += len(chunk)
                if total >= limit_bytes:
                    break
        if total >= limit_bytes:
            break
    spent = time.perf_counter() - start
    return [Row("read", str(path), total / max(spent, 1e-9) / 1e9, "GB/s",
                note=f"{total / 2 ** 20:.0f} MB from {len(files)} file(s)")]


def bench_node(device: torch.device, size: int, megabytes: int, seconds: float,
               data: Path | None) -> list[Row]:
    rows = matmul_rows(device, size, seconds) + memory_rows(device, megabytes, seconds)
    rows += all_reduce_rows(device, megabytes, seconds)
    rows += decode_rows(seconds)
    if data is not None:
        rows += read_rows(data)
    return rows


def keep(rows: list[Row], device_name: str) -> Path:
    path = node_limits_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps({"time": time.time(), "device": device_name,
                                  "rows": [r.to_json() for r in rows]}, indent=1) + "\n")
    return path
