"""The largest per-device batch that really fits, found by running steps until one does not.

Each try builds the model afresh (an out-of-memory error halfway through a step leaves DDP's
reducer or FSDP's gathered parameters in a state no later step can use), runs a few real
steps on random batches of the recipe's shape, and all ranks agree on the outcome: a size
fits only when it fits on every rank. The search starts at the prediction, doubles or halves
until it brackets the limit, then bisects to a multiple of 8.

On a GPU, a --gpu-memory smaller than the device caps this process with
torch.cuda.set_per_process_memory_fraction, so the search answers for the smaller device. On
the CPU there is no out-of-memory error to meet, so the storage tracker raises one when the
step's live bytes pass --gpu-memory: the same search, the same recovery, on an emulated device.

Under FSDP every rank gathers the same parameters at the same moment, so an out-of-memory
error meets all ranks at the same operator; a rank that failed alone would leave the others
waiting in a collective until parallel.timeout_seconds.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field

import torch

from hpctrain.cluster.environment import detect
from hpctrain.cluster.records import ProcessEnv
from hpctrain.config import Config
from hpctrain.errors import ConfigError
from hpctrain.memory.advice import MAX_BATCH, round_batch
from hpctrain.memory.estimate import Target, output_width, step_spec
from hpctrain.memory.live_memory import LiveMemory
from hpctrain.memory.simulate import run_steps
from hpctrain.parallel import data as data_parallel
from hpctrain.parallel import processes
from hpctrain.parallel.layout import resolve_layout
from hpctrain.train.hardware.system import resolve_device



@dataclass
class Trial:
    batch_size: int
    fits: bool
    images_per_second: float | None  # all ranks together
    peak_bytes: int | None  # the largest over the ranks


@dataclass
class Search:
    world_size: int
    strategy: str
    device: str
    trials: list[Trial] = field(default_factory=list)
    largest: int | None = None
    recommended: int | None = None
    grad_accum_steps: int | None = None
    global_batch_size: int | None = None
    settings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"world_size": self.world_size, "strategy": self.strategy, "device": self.device,
                "trials": [t.__dict__ for t in self.trials], "largest": self.largest,
                "recommended": self.recommended, "grad_accum_steps": self.grad_accum_steps,
                "global_batch_size": self.global_batch_size, "settings": self.settings}


class _Runner:
    """Builds and runs one try on this rank."""

    def __init__(self, config: Config, target: Target, env: ProcessEnv, steps: int):
        self.config, self.steps = config, steps
        layout = resolve_layout(config, env)
        if layout.model_parallel:
            raise ConfigError("--find-batch-size searches data-parallel layouts only; drop "
                              "parallel.tensor and parallel.pipeline for the search")
        self.strategy = layout.strategy
        self.device = resolve_device(processes.local_device(config.device, env))
        if self.device.type != target.device:
            raise ConfigError(
                "--find-batch-size runs real steps, and this machine has no GPU: run it on a "
                "GPU node, or search for a CPU process with device=cpu --gpu-memory SIZE")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        processes.check_layout(config, layout, self.device, target.precision)
        self.distributed = processes.start(config, env, layout, self.device)
        self.spec = step_spec(config, target, output_width(config)[0])
        self.limit = None
        self.capped = False
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            if target.capacity < total:
                torch.cuda.set_per_process_memory_fraction(target.capacity / total, self.device)
                self.capped = True
        else:
            self.limit = target.capacity

    def one(self, batch: int) -> tuple[bool, float | None, int | None]:
        model = optimizer = None
        tracker = LiveMemory(limit=self.limit) if self.limit is not None else None
        times: list[float] = []
        try:
            model = self.spec.build_model()
            model = data_parallel.convert_batchnorm(model, self.config, self.strategy)
            model = model.to(self.device)
            wrapped = data_parallel.wrap_model(model, self.distributed, self.config, self.device,
                                          self.spec.precision)
            optimizer = self.spec.build_optimizer(model)
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            times.append(time.perf_counter())

            def tick(step: int) -> None:
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                times.append(time.perf_counter())

            if tracker is not None:
                with tracker:
                    tracker.track_model(model)
                    run_steps(self.spec, wrapped, optimizer, batch, self.device, tracker,
                              steps=self.steps, on_step=tick)
            else:
                run_steps(self.spec, wrapped, optimizer, batch, self.device,
                          steps=self.steps, on_step=tick)
            peak = tracker.peak if tracker else torch.cuda.max_memory_allocated(self.device)
            timed = times[-1] - times[1] if len(times) > 2 else times[-1] - times[0]
            rate = batch * max(1, len(times) - 2) / timed if timed > 0 else None
            return True, rate, peak
        except torch.OutOfMemoryError:
            return False, None, None
        finally:
            del model, optimizer
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def agreed(self, batch: int) -> Trial:
        fits, rate, peak = self.one(batch)
        failed = self.distributed.any(0 if fits else 1)
        rows = self.distributed.gather([rate or 0.0, float(peak or 0)])
        if failed:
            return Trial(batch, False, None, None)
        return Trial(batch, True, sum(r[0] for r in rows), int(max(r[1] for r in rows)))


def find_batch_size(config: Config, target: Target, start: int, steps: int = 3,
                    env: ProcessEnv | None = None) -> Search:
    env = env or detect()
    runner = _Runner(config, target, env, steps)
    try:
        search = _search(runner, max(1, start))
        if search.largest is not None:
            _recommend(search, config, search.largest)
        runner.distributed.barrier()
        return search
    finally:  # a process group left to the interpreter's exit can abort in gloo's threads
        if runner.capped:  # the whole device back to a process that goes on (a notebook)
            torch.cuda.set_per_process_memory_fraction(1.0, runner.device)
        processes.leave()


def _search(runner: _Runner, batch: int) -> Search:
    """Double or halve from `batch` until the limit is bracketed, then bisect."""
    search = Search(runner.distributed.world_size, runner.strategy, str(runner.device))
    tried: dict[int, Trial] = {}

    def fits(size: int) -> bool:
        if size not in tried:
            tried[size] = runner.agreed(size)
            search.trials.append(tried[size])
        return tried[size].fits

    lo, hi = None, None
    if fits(batch):
        lo = batch
        while hi is None and batch < MAX_BATCH:
            batch *= 2
            lo, hi = (batch, hi) if fits(batch) else (lo, batch)
    else:
        hi = batch
        while lo is None and batch > 1:
            batch //= 2
            lo, hi = (batch, hi) if fits(batch) else (lo, batch)
    if lo is not None and hi is not None:
        while hi - lo > (8 if lo >= 8 else 1):
            mid = (lo + hi) // 2
            mid = mid // 8 * 8 if lo >= 8 else mid
            if mid <= lo:
                break
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    search.largest = lo
    return search


def _recommend(search: Search, config: Config, largest: int) -> None:
    """Round to a multiple of 8 and reach the recipe's global batch by accumulation."""
    world = search.world_size
    recommended = round_batch(largest)
    wanted = processes.per_device_batch(config, world)[1]
    accum = max(1, math.ceil(wanted / (recommended * world)))
    if wanted % (world * accum) == 0:
        recommended = min(recommended, wanted // (world * accum))
    search.recommended, search.grad_accum_steps = recommended, accum
    search.global_batch_size = recommended * world * accum
    search.settings = [f"train.batch_size={recommended}", f"train.grad_accum_steps={accum}"]
