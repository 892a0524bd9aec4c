"""Hand-built GPU traces in Kineto's schema, for the classes a CPU-only machine cannot record.

`Synth` plays a training step forward in time: a CPU thread that runs operators and launches
kernels (cuda_runtime calls linked to kernels by correlation ids and ac2g flows, as Kineto
writes them), GPU streams that run each kernel when both the stream and the launch allow, and
synchronising calls that hold the CPU until the GPU drains. The scenarios below describe the
classic patterns (launch-bound, sync-bound, compute-bound with and without Tensor Cores,
memory-bound, exposed communication on two ranks) as steps of such a program; the events come
out with the fields Kineto writes (cat, ph, ts, dur, pid, tid, args with External id,
correlation, stream, device, Input Dims). Events are written as they are made, so the
benchmark can produce a trace of any size in constant memory.

    python tests/kineto_synth.py tests/fixtures/gpu_traces     # rebuild the fixtures
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import sys
from pathlib import Path

PID, MAIN_TID, DEVICE = 4242, 4242, 0
COMPUTE_STREAM, NCCL_STREAM = 7, 20
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85031714816,
        "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
        "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
        "sharedMemPerBlock": 49152, "numSms": 132}

ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::"
               "CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, "
               "at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
BATCHNORM = ("void at::native::batch_norm_collect_statistics_channels_last_kernel"
             "<at::native::Welford, float, float, 4>(float const*, float*, float*, int, int)")
HOPPER_GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1"
               "_execute_segment_k_off_kernel__5x_cublas")
NVJET = "nvjet_tst_256x128_64x4_2x1_v_bz_coopB_bf16_TNT"
SIMT_GEMM = "ampere_sgemm_128x64_nn"
SIMT_CONV = ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, "
             "true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, "
             "unsigned long long, int, float, float, int, float const*, float const*, bool, "
             "int, int)")
ALLREDUCE = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, "
             "ncclWork*)")


class Synth:
    """A CPU thread and GPU streams advancing in microseconds, writing Kineto events."""

    def __init__(self, out: io.TextIOBase, start: float = 1_000_000.0):
        self.out, self.cpu, self.first = out, start, True
        self.streams: dict[int, float] = {}
        self.correlation = self.external = 0

    def emit(self, event: dict) -> None:
        self.out.write(("" if self.first else ",\n") + json.dumps(event))
        self.first = False

    def work(self, us: float) -> None:
        """CPU time spent in Python or in an operator's own code."""
        self.cpu += us

    @contextlib.contextmanager
    def span(self, category: str, name: str, **args):
        start = self.cpu
        yield
        self.external += 1
        self.emit({"ph": "X", "cat": category, "name": name, "pid": PID, "tid": MAIN_TID,
                   "ts": start, "dur": self.cpu - start,
                   "args": {"External id": self.external, **args}})

    def op(self, name: str, cpu_us: float, dims=None, dtype: str = "float"):
        """An operator: its own CPU time, then whatever the body launches."""
        args = {"Input Dims": dims, "Input type": [dtype] * len(dims)} if dims else {}
        return self.span("cpu_op", name, **args)

    def launch(self, kernel: str, gpu_us: float, stream: int = COMPUTE_STREAM,
               launch_us: float = 5.0, category: str = "kernel",
               call: str = "cudaLaunchKernel", after: int | None = None) -> None:
        """Launch a kernel; with `after`, it also waits for that stream's work (an event)."""
        self.correlation += 1
        ready = self.cpu + launch_us * 0.6
        begin = max(self.streams.get(stream, 0.0), ready + 2.0,
                    self.streams.get(after, 0.0) if after is not None else 0.0)
        self.streams[stream] = begin + gpu_us
        common = {"External id": self.external + 1, "correlation": self.correlation}
        self.emit({"ph": "X", "cat": "cuda_runtime", "name": call, "pid": PID,
                   "tid": MAIN_TID, "ts": self.cpu, "dur": launch_us,
                   "args": {**common, "cbid": 211}})
        self.emit({"ph": "s", "id": self.correlation, "pid": PID, "tid": MAIN_TID,
                   "ts": self.cpu, "cat": "ac2g", "name": "ac2g"})
        extra = {"bytes": 4, "memory bandwidth (GB/s)": 0.001} if category == "gpu_memcpy" \
            else {"grid": [132, 1, 1], "block": [256, 1, 1], "registers per thread": 64}
        self.emit({"ph": "X", "cat": category, "name": kernel, "pid": DEVICE,
                   "tid": stream, "ts": begin, "dur": gpu_us,
                   "args": {**common, "device": DEVICE, "context": 1, "stream": stream,
                            **extra}})
        self.emit({"ph": "f", "id": self.correlation, "pid": DEVICE, "tid": stream,
                   "ts": begin, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.cpu += launch_us

    def wait_stream(self, stream: int, waits_for: int) -> None:
        """cudaStreamWaitEvent: `stream` runs on only after `waits_for`'s work; the CPU goes on."""
        self.streams[stream] = max(self.streams.get(stream, 0.0),
                                   self.streams.get(waits_for, 0.0))
        self.correlation += 1
        self.emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent",
                   "pid": PID, "tid": MAIN_TID, "ts": self.cpu, "dur": 2.0,
                   "args": {"External id": self.external + 1,
                            "correlation": self.correlation, "cbid": 147}})
        self.cpu += 2.0

    def synchronize(self, call: str = "cudaStreamSynchronize") -> None:
        """The CPU waits until every stream has finished its work."""
        done = max(self.streams.values(), default=self.cpu)
        start = self.cpu
        self.cpu = max(self.cpu + 3.0, done + 2.0)
        self.correlation += 1
        self.emit({"ph": "X", "cat": "cuda_runtime", "name": call, "pid": PID,
                   "tid": MAIN_TID, "ts": start, "dur": self.cpu - start,
                   "args": {"External id": self.external + 1,
                            "correlation": self.correlation, "cbid": 131}})

    def item(self, site: str) -> None:
        """`loss.item()` in user code: a blocking device-to-host copy, then a sync."""
        with self.span("python_function", site), self.op("aten::item", 4.0), \
                self.op("aten::_local_scalar_dense", 3.0):
            self.work(3.0)
            self.launch("Memcpy DtoH (Device -> Pageable)", 2.0, category="gpu_memcpy",
                        call="cudaMemcpyAsync")
            self.synchronize()

    @contextlib.contextmanager
    def region(self, name: str):
        with self.span("user_annotation", "hpctrain/" + name):
            yield

    @contextlib.contextmanager
    def step(self, number: int):
        with self.span("user_annotation", f"ProfilerStep#{number}"):
            yield


def write_trace(path: Path, scenario, steps: int, rank: int = 0, world_size: int = 1) -> None:
    """Run `scenario(synth, rank)` once per step and write the gzip trace (mtime 0, so the
    same scenario always gives the same bytes)."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, \
            io.TextIOWrapper(zipped, encoding="utf-8") as out:
        header = {"schemaVersion": 1, "deviceProperties": [H100],
                  "distributedInfo": {"backend": "nccl", "rank": rank,
                                      "world_size": world_size}}
        out.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
        synth = Synth(out)
        synth.emit({"ph": "M", "name": "process_name", "pid": PID, "tid": 0,
                    "args": {"name": "python"}})
        for number in range(steps):
            with synth.step(number + 5):
                scenario(synth, rank)
        out.write('\n], "traceName": "%s"}\n' % path.name)


def _data(synth: Synth, us: float = 150.0) -> None:
    with synth.region("data_wait"):
        synth.work(us)
    with synth.region("h2d_copy"), synth.op("aten::copy_", 8.0):
        synth.work(8.0)
        synth.launch("Memcpy HtoD (Pinned -> Device)", 40.0, category="gpu_memcpy",
                     call="cudaMemcpyAsync")


def launch_bound(synth: Synth, rank: int) -> None:
    """A small model at a small batch: hundreds of tiny kernels, each launched by Python."""
    _data(synth)
    for region, count in (("forward", 150), ("backward", 300), ("optimizer", 150)):
        with synth.region(region):
            for _ in range(count):
                with synth.op("aten::add", 12.0):
                    synth.work(12.0)
                    synth.launch(ELEMENTWISE, 3.0)


def sync_bound(synth: Synth, rank: int) -> None:
    """Large kernels, but the user's code reads the loss every step (`loss.item()`), so the
    CPU cannot run ahead: the GPU idles while Python prepares the next launches."""
    _data(synth)
    with synth.region("forward"):
        for _ in range(20):
            with synth.op("aten::mm", 10.0):
                synth.launch(HOPPER_GEMM, 250.0)
        synth.item("train.py(57): training_step")
        synth.work(4000.0)  # Python bookkeeping between the read and the backward launches
    with synth.region("backward"):
        for _ in range(40):
            with synth.op("aten::mm", 10.0):
                synth.launch(HOPPER_GEMM, 250.0)
        synth.item("train.py(63): training_step")
        synth.work(3000.0)
    with synth.region("optimizer"):
        with synth.op("aten::_foreach_add_", 30.0):
            synth.launch(ELEMENTWISE, 200.0)


def _busy_step(synth: Synth, matrix_kernels: tuple[str, ...], other: str,
               matrix_us: float, other_us: float, count: int,
               dims=None, dtype: str = "float") -> None:
    """The CPU launches far ahead of a GPU that is never starved."""
    _data(synth, 50.0)
    for region, repeat in (("forward", count), ("backward", 2 * count)):
        with synth.region(region):
            for i in range(repeat):
                with synth.op("aten::addmm", 15.0, dims=dims, dtype=dtype):
                    synth.launch(matrix_kernels[i % len(matrix_kernels)], matrix_us)
                with synth.op("aten::add", 8.0):
                    synth.launch(other, other_us)
    with synth.region("optimizer"):
        with synth.op("aten::_foreach_add_", 30.0):
            synth.launch(ELEMENTWISE, 100.0)
        _keep_ahead(synth)


def _keep_ahead(synth: Synth, lead_us: float = 300.0) -> None:
    """The CPU stays a little ahead of the GPU, as the bounded CUDA launch queue keeps it
    (the wait shows as time in the optimizer step, where the queue fills up)."""
    synth.work(max(0.0, synth.streams[COMPUTE_STREAM] - synth.cpu - lead_us))


def compute_bound_tensor_cores(synth: Synth, rank: int) -> None:
    _busy_step(synth, (HOPPER_GEMM, NVJET), ELEMENTWISE, 900.0, 40.0, 30,
               dims=[[4096], [8192, 4096], [4096, 4096]], dtype="c10::BFloat16")


def compute_bound_no_tensor_cores(synth: Synth, rank: int) -> None:
    _busy_step(synth, (SIMT_GEMM, SIMT_CONV), ELEMENTWISE, 900.0, 40.0, 30,
               dims=[[50257], [512, 768], [768, 50257]], dtype="float")


def memory_bound(synth: Synth, rank: int) -> None:
    _busy_step(synth, (HOPPER_GEMM,), BATCHNORM, 60.0, 400.0, 30,
               dims=[[512], [256, 512], [512, 512]], dtype="c10::BFloat16")


def exposed_communication(synth: Synth, rank: int) -> None:
    """Data parallelism on two ranks whose gradient all-reduce starts only after the backward
    pass: most of the communication is exposed. Rank 1 is a little slower."""
    _data(synth, 60.0 + 40.0 * rank)
    with synth.region("forward"):
        for _ in range(10):
            with synth.op("aten::mm", 10.0):
                synth.launch(HOPPER_GEMM, 300.0)
    with synth.region("backward"):
        for i in range(20):
            with synth.op("aten::mm", 10.0):
                synth.launch(HOPPER_GEMM, 300.0)
            if i == 16:  # the last bucket's reduction overlaps the tail of the backward
                with synth.op("record_param_comms", 8.0):
                    synth.launch(ALLREDUCE, 7000.0 + 300.0 * rank, stream=NCCL_STREAM,
                                 after=COMPUTE_STREAM)
    with synth.region("optimizer"):
        synth.wait_stream(COMPUTE_STREAM, NCCL_STREAM)
        with synth.op("aten::_foreach_add_", 30.0):
            synth.launch(ELEMENTWISE, 150.0)
        _keep_ahead(synth)


SCENARIOS = {"launch_bound": (launch_bound, 1), "sync_bound": (sync_bound, 1),
             "compute_bound_tensor_cores": (compute_bound_tensor_cores, 1),
             "compute_bound_no_tensor_cores": (compute_bound_no_tensor_cores, 1),
             "memory_bound": (memory_bound, 1),
             "exposed_communication": (exposed_communication, 2)}
STEPS = 4


def build_fixtures(folder: Path) -> list[Path]:
    """Every scenario as `<name>/trace.rank<R>.json.gz`."""
    written = []
    for name, (scenario, ranks) in SCENARIOS.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        for rank in range(ranks):
            path = folder / name / f"trace.rank{rank}.json.gz"
            write_trace(path, scenario, STEPS, rank, ranks)
            written.append(path)
    return written


if __name__ == "__main__":
    for written in build_fixtures(Path(sys.argv[1])):
        print(written)
