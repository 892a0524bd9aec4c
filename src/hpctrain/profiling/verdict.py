"""The verdict: what bounds this run, the numbers that decided it, and what to change.

Idle-type losses are measured as shares of the step (analysis.py): waiting for data, GPU idle
after a host synchronisation, GPU idle waiting for kernel launches, exposed communication.
The largest one is the verdict when it reaches PRIMARY; otherwise the GPU is busy and the
kernel mix decides between memory-bound (mostly elementwise, normalisation and other
bandwidth-limited kernels) and compute-bound (mostly matrix kernels). Every cause worth
MINOR or more gets its recommendations, ranked by the share of the step it could give back.
Recommendations are hpctrain settings, adapted to the run's settings when they are known
(a profiled run's config.yaml and summary.json); the expected effect is an upper bound: the
time the cause costs now.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from hpctrain.config import Strategy
from hpctrain.profiling.analysis import Evidence

HPCTRAIN_FRAMES = "hpctrain/"  # how the profiler names a frame of hpctrain's own code

PRIMARY = 0.15  # a cause costing this share of the step is the verdict
MINOR = 0.05  # below this a cause gets no recommendation
MEMORY_BOUND = 0.5  # share of compute kernel time outside matrix kernels
TENSOR_CORES_BUSY = 0.8  # share of matrix time on Tensor Cores that leaves nothing to gain
# GPUs with FP8 Tensor Cores (compute capability 8.9 or newer), by name
FP8_GPUS = re.compile(r"h100|h200|h800|\bl4\b|l40|b100|b200|rtx 40[6-9]0|ada generation", re.I)
FP8_WORTHWHILE = 0.5  # share of the matrix time in FP8 kernels below which casts eat the gain

CLASSES = ("input-bound", "launch-bound", "sync-bound", "communication-bound",
           "memory-bound", "compute-bound")
_CAUSE_CLASS = {"input": "input-bound", "launch": "launch-bound", "sync": "sync-bound",
                "communication": "communication-bound"}


@dataclass
class Settings:
    """The run's relevant settings, resolved where the run said how (None: unknown)."""

    recipe: str = "RECIPE"
    dataset: str | None = None
    num_workers: int | None = None
    prefetch_factor: int | None = None
    decode: str | None = None
    precision: str | None = None
    device_name: str | None = None
    channels_last: bool | None = None
    compile: bool | None = None
    cuda_graphs: bool | None = None  # compiled in a mode that captures CUDA graphs
    batch_size: int | None = None
    strategy: str | None = None
    log_every: int | None = None
    cores: int | None = None
    mfu: float | None = None  # the profiled run's model FLOPs utilisation (language models)
    mfu_peak: str | None = None  # what it divides by: "measured bf16", "spec bf16"


@dataclass
class Recommendation:
    setting: str
    why: str
    expected: str
    gain: float  # share of the step at stake, for ranking

    def line(self) -> str:
        return f"{self.setting}: {self.why} ({self.expected})"


@dataclass
class Verdict:
    bound: str
    reason: str
    numbers: dict
    recommendations: list[Recommendation] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def mean_losses(ranks: list[Evidence]) -> dict[str, float]:
    causes = sorted({cause for e in ranks for cause in e.losses})
    return {c: sum(e.losses.get(c, 0.0) for e in ranks) / len(ranks) for c in causes}


def decide(ranks: list[Evidence], settings: Settings = Settings()) -> Verdict:
    """One verdict for the run (losses averaged over ranks; the shape evidence of rank 0)."""
    first = ranks[0]
    losses = mean_losses(ranks)
    cause, loss = max(losses.items(), key=lambda kv: kv[1])
    numbers = {f"{c}_loss": round(v, 4) for c, v in losses.items()}
    if loss >= PRIMARY:
        bound = _CAUSE_CLASS[cause]
        reason = _REASONS[cause](first, loss)
    elif first.gpu and first.kernel_mix["other_share"] >= MEMORY_BOUND:
        bound = "memory-bound"
        reason = (f"the GPU is busy {1 - first.temporal['idle']:.0%} of the time, and "
                  f"{first.kernel_mix['other_share']:.0%} of its compute time is in "
                  "elementwise, normalisation and other bandwidth-limited kernels")
    else:
        bound = "compute-bound"
        if first.gpu:
            reason = (f"the GPU is busy {1 - first.temporal['idle']:.0%} of the time, "
                      f"{first.kernel_mix['matrix_share']:.0%} of it in matrix kernels, "
                      f"{first.tensor_cores['share_of_matrix_time']:.0%} of those on Tensor "
                      "Cores")
        else:
            reason = (f"CPU-only trace: the step is computation on the CPU (data wait "
                      f"{first.data_wait_share:.0%}); the GPU evidence (idle time, launches, "
                      "synchronisation, Tensor Cores) needs a GPU run")
    if first.gpu:
        numbers.update(gpu_busy=round(1 - first.temporal["idle"], 4),
                       matrix_share=round(first.kernel_mix["matrix_share"], 4),
                       tensor_core_share=round(first.tensor_cores["share_of_matrix_time"], 4))
    if settings.mfu is not None:
        numbers.update(mfu=round(settings.mfu, 4), mfu_peak=settings.mfu_peak)
    recommendations = []
    for name, value in sorted(losses.items(), key=lambda kv: -kv[1]):
        if value >= MINOR:
            recommendations += _ADVICE[name](first, value, settings)
    if bound in ("memory-bound", "compute-bound") and first.gpu:
        recommendations += _busy_gpu_advice(first, bound, settings)
    recommendations.sort(key=lambda r: -r.gain)
    return Verdict(bound, reason, numbers, recommendations)


def _input_reason(e: Evidence, loss: float) -> str:
    wait = e.regions.get("data_wait", {})
    return (f"{loss:.0%} of the step is spent waiting for the DataLoader (data wait "
            f"{wait.get('mean_ms', 0):.1f} ms of a {e.step_ms['mean']:.1f} ms step, up to "
            f"{wait.get('max_ms', 0):.1f} ms)")


def _launch_reason(e: Evidence, loss: float) -> str:
    launch = e.launch
    return (f"the GPU waits for the CPU to launch work {loss:.0%} of the time: "
            f"{launch['kernels_per_step']:.0f} kernels per step, median "
            f"{launch['median_kernel_us']:.0f} us, {launch['short_kernel_share']:.0%} shorter "
            f"than their launch call; the CPU spends {launch['cpu_launch_ms_per_step']:.1f} ms "
            f"per step launching for {launch['gpu_busy_ms_per_step']:.1f} ms of GPU work")


def _sync_reason(e: Evidence, loss: float) -> str:
    site = e.sync["sites"][0] if e.sync["sites"] else {}
    where = f", most at {site['call_site'] or site['op']}" if site else ""
    return (f"the GPU idles {loss:.0%} of the time after host synchronisations: "
            f"{e.sync['calls_per_step']:.0f} blocking calls per step holding the CPU "
            f"{e.sync['ms_per_step']:.1f} ms{where}")


def _communication_reason(e: Evidence, loss: float) -> str:
    comm = e.communication or {}
    return (f"{loss:.0%} of the GPU time is communication that nothing overlaps "
            f"(communication {comm.get('share', 0):.0%} of the time, "
            f"{comm.get('overlap', 0):.0%} of it overlapped with computation)")


_REASONS = {"input": _input_reason, "launch": _launch_reason, "sync": _sync_reason,
            "communication": _communication_reason}


def _up_to(gain: float) -> str:
    return f"up to {gain:.0%} shorter steps"


def _input_advice(e: Evidence, gain: float, s: Settings) -> list[Recommendation]:
    out = []
    if s.dataset == "imagefolder":
        out.append(Recommendation(
            "hpctrain pack DATA PACK, then data.dataset=shards data.path=PACK",
            "reading one file per image is the slowest way to feed a GPU; packed shards read "
            "sequentially and decode faster", _up_to(gain), gain))
    if s.cores and (s.num_workers is None or s.num_workers < s.cores - 1):
        workers = max(1, s.cores - 1)
        out.append(Recommendation(
            f"data.num_workers={workers}",
            f"{s.num_workers if s.num_workers is not None else 'few'} loader processes for "
            f"{s.cores} cores", _up_to(gain), gain * 0.99))
    if s.dataset == "shards" and s.decode == "cpu" and e.gpu:
        out.append(Recommendation("data.images.decode=gpu", "decode JPEGs with nvJPEG on the GPU, "
                                  "off the CPU cores", _up_to(gain), gain * 0.98))
    wait = e.regions.get("data_wait", {})
    if wait and wait["max_ms"] > 4 * max(wait["mean_ms"], 1e-3) and (s.prefetch_factor or 4) < 8:
        out.append(Recommendation(
            "data.prefetch_factor=8", f"the waits come in bursts (mean {wait['mean_ms']:.1f} "
            f"ms, worst {wait['max_ms']:.1f} ms): a deeper queue absorbs them",
            _up_to(gain), gain * 0.5))
    out.append(Recommendation(
        f"hpctrain bench data {s.recipe} --model", "measures the loader against the model "
        "and picks the worker count and prefetch depth", "finds the setting", gain * 0.9))
    return out


def _launch_advice(e: Evidence, gain: float, s: Settings) -> list[Recommendation]:
    out = []
    if not s.compile:
        out.append(Recommendation("compile=true", "torch.compile fuses small kernels: fewer "
                                  "launches for the same work", _up_to(gain), gain))
    if not s.cuda_graphs:
        out.append(Recommendation("compile=true compile_mode=reduce-overhead", "CUDA graphs "
                                  "replay the whole step with one launch", _up_to(gain),
                                  gain * 0.95))
    batch = f"train.batch_size={2 * s.batch_size}" if s.batch_size else "a larger batch"
    out.append(Recommendation(batch, "the same launches carry twice the work",
                              f"about {gain / 2:.0%} less launch overhead per sample",
                              gain * 0.5))
    return out


def _sync_advice(e: Evidence, gain: float, s: Settings) -> list[Recommendation]:
    """A host read in your code (or in a library your code calls): remove it; hpctrain's
    metric read-back: read less often; another of hpctrain's own reads (its tasks, its data),
    or a library's read that hpctrain's code calls (torch's optimiser), is no advice for you
    to act on."""
    out = []
    for site in e.sync["sites"][:3]:
        where = site.get("called_from") or site["call_site"] or f"the caller of {site['op']}"
        share = gain * site["ms"] / max(sum(x["ms"] for x in e.sync["sites"]), 1e-9)
        inside = site.get("called_from") is not None  # a library's read, called from `where`
        if where.startswith(HPCTRAIN_FRAMES) and (inside or
                                                  not where.startswith("hpctrain/train/")) \
                or inside and ".py(" not in where:  # called from a module, not a line
            continue  # listed among the evidence, not yours to change
        if where.startswith("hpctrain/train/"):
            out.append(Recommendation(
                f"train.log_every={max(2 * (s.log_every or 20), 50)}",
                f"hpctrain's own metric read-back ({where}) synchronises: read less often",
                _up_to(share), share))
        else:
            out.append(Recommendation(
                f"remove the host read at {where}",
                f"{site['op'] or site['call']}"
                + (f" (in {site['call_site']})" if inside else "")
                + f" waits for the GPU {site['calls']} times "
                f"({site['ms']:.1f} ms); keep values on the device and read them every "
                "train.log_every steps", _up_to(share), share))
    return out


def _communication_advice(e: Evidence, gain: float, s: Settings) -> list[Recommendation]:
    out = [Recommendation("train.grad_accum_steps=2", "gradients are reduced once per "
                          "accumulated step: half the communication per sample",
                          f"about {gain / 2:.0%} shorter steps per sample", gain * 0.5)]
    if s.strategy == Strategy.FSDP:
        out.append(Recommendation("parallel.reshard_after_forward=false", "ZeRO-2: keep "
                                  "gathered parameters for backward, one all-gather fewer",
                                  _up_to(gain / 2), gain * 0.45))
    else:
        out.append(Recommendation("parallel.bucket_cap_mb=100", "larger gradient buckets: "
                                  "fewer, better-overlapped all-reduces", _up_to(gain / 2),
                                  gain * 0.4))
    batch = f"train.batch_size={2 * s.batch_size}" if s.batch_size else "a larger batch"
    out.append(Recommendation(batch, "twice the computation to hide the same communication",
                              f"about {gain / 2:.0%} less per sample", gain * 0.35))
    return out


def _busy_gpu_advice(e: Evidence, bound: str, s: Settings) -> list[Recommendation]:
    out = []
    low_precision = s.precision in ("bf16", "fp16", "fp8")
    tensor_share = e.tensor_cores["share_of_matrix_time"]
    matrix = e.kernel_mix["matrix_share"]
    fp8_share = e.tensor_cores["precision"].get("fp8", 0.0)
    if s.precision == "fp8" and matrix > 0 and fp8_share < FP8_WORTHWHILE:
        out.append(Recommendation(
            "precision=bf16", f"only {fp8_share:.0%} of the matrix time runs in FP8 kernels: "
            "the model's matrices are too small (or kept in bf16) for FP8 to gain, while "
            "every float8 layer still pays for its casts and scales",
            "the casts' time back", matrix * (1 - fp8_share) / 4))
    if bound == "memory-bound":
        other = e.kernel_mix["other_share"]
        if not s.compile:
            out.append(Recommendation("compile=true", "fusing elementwise kernels reads and "
                                      "writes memory once instead of once per operation",
                                      "often 1.3-2x on bandwidth-bound steps", other))
        if not low_precision:
            out.append(Recommendation("precision=bf16", "half the bytes for every "
                                      "activation read and written", _up_to(other / 2),
                                      other / 2))
        if s.channels_last is False:
            out.append(Recommendation("channels_last=true", "convolutions and normalisation "
                                      "without layout transposes", "a few % to 20 %",
                                      other / 4))
        return out
    if s.precision == "bf16" and tensor_share >= TENSOR_CORES_BUSY and \
            matrix >= FP8_WORTHWHILE and FP8_GPUS.search(s.device_name or ""):
        out.append(Recommendation(
            "precision=fp8 (pip install 'hpctrain[fp8]')", f"{matrix:.0%} of the GPU time is "
            f"bf16 matrix work already on Tensor Cores; the {s.device_name}'s FP8 Tensor Cores "
            "run large matrices at twice that rate", "up to about 1.5x on large transformers "
            "(torchao's H100 figures)", matrix / 4))
    if tensor_share < TENSOR_CORES_BUSY and matrix > 0:
        if not low_precision:
            out.append(Recommendation(
                "precision=bf16", f"only {tensor_share:.0%} of the matrix time runs on Tensor "
                "Cores; bf16 matrix kernels run on them at several times the fp32 rate",
                "up to 2-3x faster matrix work", matrix * (1 - tensor_share)))
        odd = e.matrix_dims["offenders"][:2]
        if odd:
            shapes = "; ".join(f"{o['op']} {o['dims_not_multiple_of_8']}" for o in odd)
            out.append(Recommendation(
                "model.kwargs: widths, vocabulary and class counts in multiples of 8",
                f"{e.matrix_dims['share_of_matrix_time']:.0%} of the matrix time has "
                f"dimensions Tensor Cores cannot tile ({shapes})",
                "Tensor Core kernels for those operators",
                matrix * e.matrix_dims["share_of_matrix_time"] / 2))
    return out


_ADVICE = {"input": _input_advice, "launch": _launch_advice, "sync": _sync_advice,
           "communication": _communication_advice}
