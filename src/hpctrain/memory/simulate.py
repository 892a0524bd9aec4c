"""One training step's memory, predicted without memory (FakeTensorMode) or measured on CPU.

Both drive the engine's own step (train/step.py: forward under autocast, loss, backward,
optimiser step, gradients set to None), its regions telling the storage counter which phase
allocates; a measurement runs it twice and reports the second step (the optimiser's states
exist from then on, as in every later step).

FakeTensorMode executes every operator's shape and dtype logic but allocates nothing, so a
step at batch 1024 costs what batch 1 costs. Autograd's engine refuses fake CUDA tensors on a
machine without a GPU, so the whole step runs on fake CPU tensors; for a GPU target the
forward pass runs a second time on fake CUDA tensors, and the activations of the full step
are scaled to what CUDA holds: its autocast rules keep layer norms, softmax and losses in
fp32 where CPU's do not, and its dropout keeps a 1-byte mask where CPU's keeps the input's
dtype.

When a model cannot run on fake tensors (an operator whose output size depends on data, a
`.item()` in forward), the step is measured for real on the CPU at batch 4 and 8 and each
category extrapolated linearly to the batch asked for; the result says so.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from hpctrain.memory.attention import TargetAttention
from hpctrain.memory.live_memory import CATEGORIES, LiveMemory
from hpctrain.models.sizing import refuse_if_too_large
from hpctrain.profiling.regions import region
from hpctrain.tasks.steps import Batch
# fp8 is simulated as its bf16 autocast (AUTOCAST_DTYPES)
from hpctrain.train.hardware.precision import AUTOCAST_DTYPES, Precision
from hpctrain.train.step import BatchHooks, Step, forward, take_step

CUDA_GRANULARITY = 512  # the CUDA caching allocator rounds every block up to 512 bytes
FIXED = ("parameters", "optimizer states")  # what does not grow with the batch
SAMPLE_BATCH = 8  # the larger of the two real batches a fallback measures
INPUT_REGIONS = ("data_wait", "h2d_copy")  # the step's regions that make the batch: "inputs"
MIN_REPEATS = 6  # alike blocks from which a simulation extends two and three to all
BUILDS_KEPT = 4
_BUILT: dict[str, nn.Module] = {}  # model_key -> the model built on the meta device


@dataclass
class StepSpec:
    """What one training step is made of, independent of where it runs."""

    build_model: Callable[[], nn.Module]  # builds on the current default device
    make_batch: Callable[[int, torch.device], tuple[torch.Tensor, torch.Tensor]]
    build_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (outputs, targets)
    precision: str  # fp32 | tf32 | fp16 | bf16
    target: str  # cuda | cpu: whose autocast rules and allocator to predict for
    clip_norm: float | None = None
    capability: tuple[int, int] = (9, 0)  # the target GPU's: its attention kernel
    # what sets the model's shapes (its name, settings, output width, checkpointing): specs
    # with the same key share one build on the meta device (shared_build); None: no sharing
    model_key: str | None = None
    # a LightningModule's order: the gradients zeroed before the next backward, so that they
    # live through its forward (train/step.BatchHooks)
    lightning_order: bool = False


@dataclass
class Footprint:
    """One step's memory on one device, at one batch size."""

    batch_size: int
    peak: int
    at_peak: dict[str, int]  # the split of the peak by category
    end_of_forward: dict[str, int]  # what the forward pass leaves for backward
    method: str  # fake | measured | extrapolated
    notes: list[str] = field(default_factory=list)
    phase_peaks: dict[str, dict[str, int]] = field(default_factory=dict)  # measured ones

    @property
    def activations(self) -> int:
        return self.end_of_forward["activations"]


@contextlib.contextmanager
def autocast_rules(device_type: str, precision: str):
    """Autocast for `device_type` even where that device is absent (fake CUDA tensors):
    torch.autocast switches itself off then, the lower-level switches do not."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        yield
        return
    enabled, old = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device_type, enabled)
        torch.set_autocast_dtype(device_type, old)


class _NoTracker:
    """Stands in for LiveMemory where the device counts for itself (CUDA)."""

    phase = "forward"
    totals: dict = {}

    def reset_peak(self) -> None:
        pass

    def track_optimizer(self, optimizer) -> None:
        pass


class _SimulatedPrecision(Precision):
    """The engine's precision as memory runs it: autocast's rules switched on directly, so
    that they apply to fake CUDA tensors on a machine without a GPU, and no loss scaling (its
    scale is one number, which moves no memory)."""

    def __init__(self, name: str, device_type: str):
        super().__init__("fp32", torch.device(device_type))
        self.rules = device_type, name

    def autocast(self):
        return autocast_rules(*self.rules)


class _Phases:
    """`phase(name)` for the step: the engine's region, and the storage counter told which
    phase allocates (the batch's regions are its "inputs"); remembers what the forward pass
    left alive, and labels the optimiser's states once its update has made them."""

    def __init__(self, tracker: LiveMemory | _NoTracker, optimizer):
        self.tracker, self.optimizer = tracker, optimizer
        self.end_of_forward: dict[str, int] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.tracker.phase = "inputs" if name in INPUT_REGIONS else name
        with region(name):
            yield
        if name == "forward":
            self.end_of_forward = dict(self.tracker.totals)
        elif name == "optimizer":
            self.tracker.track_optimizer(self.optimizer)


def _step(spec: StepSpec, model: nn.Module, optimizer: torch.optim.Optimizer | None,
          device: torch.device) -> Step:
    """The spec's step as the engine's Step: its batches are (inputs, targets) pairs."""
    return Step(model=model, params=[p for p in model.parameters() if p.requires_grad],
                to_device=lambda pair: Batch(pair[0], pair[1], pair[1]),
                loss=lambda outputs, batch: spec.criterion(outputs, batch.targets),
                precision=_SimulatedPrecision(spec.precision, device.type),
                optimizer=optimizer, clip_norm=spec.clip_norm,
                hooks=_NO_HOOKS if spec.lightning_order else None)


def _nothing(*args) -> None:
    return None


# the engine's order for a LightningModule, its hooks' own work left out (user code on fake
# tensors)
_NO_HOOKS = BatchHooks(*([_nothing] * 5))


def run_steps(spec: StepSpec, model: nn.Module, optimizer: torch.optim.Optimizer,
              batch_size: int, device: torch.device, tracker: LiveMemory | None = None,
              steps: int = 2, on_step: Callable[[int], None] | None = None) -> dict[str, int]:
    """`steps` training steps under `tracker`; the peak is reset before the last.
    Returns the split at the end of the last forward pass."""
    tracker = tracker or _NoTracker()
    step, phases = _step(spec, model, optimizer, device), _Phases(tracker, optimizer)
    for number in range(steps):
        if number == steps - 1:
            tracker.reset_peak()
        take_step(step, lambda: spec.make_batch(batch_size, device), phases)
        if on_step is not None:
            on_step(number)
    return phases.end_of_forward


def run_forward(spec: StepSpec, model: nn.Module, batch_size: int, device: torch.device,
                tracker: LiveMemory) -> dict[str, int]:
    """The step's batch and forward pass alone: the split it leaves for backward."""
    step, phases = _step(spec, model, None, device), _Phases(tracker, None)
    tracker.reset_peak()
    with phases("h2d_copy"):
        batch = step.to_device(spec.make_batch(batch_size, device))
    forward(step, batch, phases)
    return phases.end_of_forward


def meta_model(spec: StepSpec, keep: int | None = None) -> nn.Module:
    """A copy of the spec's model on the meta device (`shared_build`), its repeated blocks
    cut to the first `keep` where given: only the blocks kept are copied (copying gpt-1b's 24
    to keep 2 was a third of its simulations' time)."""
    built = shared_build(spec)
    blocks = repeated_blocks(built) if keep is not None else None
    if blocks is None:
        return copy.deepcopy(built)
    every = blocks._modules
    blocks._modules = type(every)(list(every.items())[:keep])  # copied so, then put back
    try:
        return copy.deepcopy(built)
    finally:
        blocks._modules = every


def shared_build(spec: StepSpec) -> nn.Module:
    """The spec's model built on the meta device, to be read, never changed (meta_model makes
    copies to run): a billion-parameter model takes about a second to build even there, and
    `hpctrain memory` simulates it a dozen times (with and without checkpointing, at several
    batch sizes), so specs with the same `model_key` share one build (the last BUILDS_KEPT
    kept)."""
    built = _BUILT.pop(spec.model_key, None) if spec.model_key else None
    if built is None:
        try:
            with torch.device("meta"):
                built = spec.build_model()
        except Exception:  # an initialiser that needs real values: build for real, keep shapes
            built = spec.build_model()
    if spec.model_key:
        _BUILT[spec.model_key] = built  # the most recent last
        while len(_BUILT) > BUILDS_KEPT:
            _BUILT.pop(next(iter(_BUILT)))
    return built


def repeated_blocks(model: nn.Module) -> nn.Module | None:
    """The longest ModuleList, Sequential or ModuleDict of MIN_REPEATS blocks or more that are
    all alike (one class, the same parameter names, shapes and dtypes): a transformer's
    layers. None where the model has none."""
    def signature(block: nn.Module) -> tuple:
        return type(block), tuple((name, tuple(p.shape), p.dtype)
                                  for name, p in block.named_parameters())

    best = None
    for module in model.modules():
        if isinstance(module, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) and \
                len(module) >= MIN_REPEATS and (best is None or len(module) > len(best)):
            children = list(module.children())
            first = signature(children[0])
            if len(children) == len(module) and all(signature(c) == first
                                                    for c in children[1:]):
                best = module
    return best


def _fake_model(spec: StepSpec, mode: FakeTensorMode, device: str,
                keep: int | None = None) -> nn.Module:
    """The model built on the meta device (its repeated blocks cut to `keep` when given),
    its tensors replaced by fake ones on `device` (tied weights stay tied)."""
    model = meta_model(spec, keep)
    fakes: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(t) not in fakes:
            with mode:
                new = torch.zeros(t.shape, dtype=t.dtype, device=device)
            fakes[id(t)] = nn.Parameter(new, t.requires_grad) if parameter else new
        return fakes[id(t)]

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = fake(p, True)
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fake(b, False)
    return model


def _forward_split(spec: StepSpec, batch_size: int, device: str,
                   keep: int | None = None) -> tuple[dict[str, int], set[str]]:
    """What the forward pass leaves on fake `device` tensors, and the attention kernels the
    target GPU runs in it (attention.py)."""
    mode = FakeTensorMode()
    model = _fake_model(spec, mode, device, keep)
    tracker = LiveMemory(CUDA_GRANULARITY if device == "cuda" else 1)
    attention = TargetAttention(spec.capability)
    with mode, tracker, attention:
        tracker.track_model(model)
        return run_forward(spec, model, batch_size, torch.device(device), tracker), \
            attention.chosen


@dataclass
class _Simulated:
    """What one simulation counts: the split at each phase's peak, at the end of the
    forward pass on the CPU and (for a GPU target) on CUDA, and the attention kernels."""

    phase_peaks: dict[str, dict[str, int]]
    end: dict[str, int]
    cuda_end: dict[str, int] | None
    kernels: set[str]

    def extended(self, larger: _Simulated, steps: int) -> _Simulated:
        """`steps` more blocks than `larger`, which has one block more than this: every
        count on its line through the two (a uniform block adds the same bytes each time)."""
        def line(a: dict, b: dict) -> dict:
            return {c: b[c] + (b[c] - a[c]) * steps for c in b}

        return _Simulated({phase: line(self.phase_peaks[phase], peaks)
                           for phase, peaks in larger.phase_peaks.items()
                           if phase in self.phase_peaks},
                          line(self.end, larger.end),
                          line(self.cuda_end, larger.cuda_end) if larger.cuda_end else None,
                          larger.kernels)


def _simulated(spec: StepSpec, batch_size: int, keep: int | None = None) -> _Simulated:
    granularity = CUDA_GRANULARITY if spec.target == "cuda" else 1
    mode = FakeTensorMode()
    model = _fake_model(spec, mode, "cpu", keep)
    tracker = LiveMemory(granularity)
    with mode, tracker:
        tracker.track_model(model)
        optimizer = spec.build_optimizer(model)
        _prime(optimizer, tracker)
        end = run_steps(spec, model, optimizer, batch_size, torch.device("cpu"), tracker,
                        steps=1)
    cuda, kernels = _forward_split(spec, batch_size, "cuda", keep) \
        if spec.target == "cuda" else (None, set())
    return _Simulated(dict(tracker.phase_peaks), end, cuda, kernels)


def _prime(optimizer: torch.optim.Optimizer, tracker: LiveMemory) -> None:
    """The optimiser's states made as its first step makes them, without that step's forward
    and backward (a third of a simulation's time): zero gradients, one step, the gradients
    dropped. The one step simulated then starts with every state in place, as a steady-state
    step does."""
    tracker.phase = "optimizer"
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    tracker.track_optimizer(optimizer)
    optimizer.zero_grad(set_to_none=True)


def simulate(spec: StepSpec, batch_size: int, extend: bool = True) -> Footprint:
    """The predicted steady-state step at `batch_size`, on fake tensors. A model with
    MIN_REPEATS or more alike blocks (a transformer's layers) is simulated with two and with
    three of them, and each count extended on its line to all of them: the same bytes as the
    whole model's simulation, in a fraction of its time (the phase peaks are extended one by
    one, so a peak that moves from the forward pass to the optimiser as blocks are added is
    still found). `extend=False` simulates every block."""
    blocks = repeated_blocks(shared_build(spec)) if extend else None
    try:
        counted = _simulated(spec, batch_size, 2).extended(_simulated(spec, batch_size, 3),
                                                           len(blocks) - 3) if blocks else None
    except Exception:  # a forward that needs all its blocks: simulate the whole model
        counted = None
    counted = counted or _simulated(spec, batch_size)
    at_peak = dict(max(counted.phase_peaks.values(), key=lambda split: sum(split.values())))
    end, notes = dict(counted.end), []
    if spec.target == "cuda":
        for category in ("activations", "weight copies"):
            if end[category]:
                ratio = counted.cuda_end[category] / end[category]
                at_peak[category] = round(at_peak[category] * ratio)
                end[category] = counted.cuda_end[category]
        notes.append("activations sized by CUDA's kernels and autocast rules")
        notes.extend(f"attention: {kernel}, the kernel the GPU picks" for kernel in
                     sorted(counted.kernels))
    return Footprint(batch_size, sum(at_peak.values()), at_peak, end, "fake", notes)


def measure_cpu(spec: StepSpec, batch_size: int, limit: int | None = None,
                steps: int = 2) -> Footprint:
    """The same step on real CPU tensors: what autograd holds after forward, and the peak."""
    model = spec.build_model()
    tracker = LiveMemory(limit=limit)
    with tracker:
        tracker.track_model(model)
        optimizer = spec.build_optimizer(model)
        end = run_steps(spec, model, optimizer, batch_size, torch.device("cpu"), tracker,
                        steps=steps)
    return Footprint(batch_size, tracker.peak, dict(tracker.at_peak), end, "measured",
                     phase_peaks=dict(tracker.phase_peaks))


def extrapolate(small: Footprint, larger: Footprint, batch_size: int) -> Footprint:
    """Each category as a + b x batch through two measured footprints, the fixed ones as
    measured, phase by phase: small batches peak in the optimiser step, large ones in
    backward, so each phase's peak is extended on its own line and the highest one kept."""
    def line(a: dict, b: dict) -> dict:
        span = larger.batch_size - small.batch_size
        return {c: a[c] if c in FIXED else max(0, round(
            a[c] + (b[c] - a[c]) * (batch_size - small.batch_size) / span)) for c in CATEGORIES}

    held = line(small.end_of_forward, larger.end_of_forward)
    candidates = [line(small.phase_peaks[p], larger.phase_peaks[p])
                  for p in small.phase_peaks if p in larger.phase_peaks]
    at_peak = max([held, *candidates], key=lambda d: sum(d.values()))
    return Footprint(batch_size, sum(at_peak.values()), at_peak, held, "extrapolated",
                     small.notes)


def predict(spec: StepSpec, batch_size: int) -> Footprint:
    """simulate(), or when the model does not run on fake tensors, CPU measurements at batch 1
    and 2 extrapolated (the report says which)."""
    try:
        return simulate(spec, batch_size)
    except Exception as err:  # any operator fake tensors cannot run
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160]}" \
            if str(err).strip() else type(err).__name__
    # measured on the CPU, it is built there: its parameters and gradients must fit
    refuse_if_too_large(f"the model (it does not run on fake tensors: {reason})",
                        shared_build(spec), copies=2, held="with its gradients, to measure "
                        "it on the CPU")
    larger = min(batch_size, SAMPLE_BATCH)
    smaller = max(1, larger // 2)
    if smaller == larger:
        larger += 1
    result = extrapolate(measure_cpu(spec, smaller), measure_cpu(spec, larger), batch_size)
    result.notes = [f"the model does not run on fake tensors ({reason}); measured on the CPU "
                    f"at batch {smaller} and {larger} and extrapolated (CPU autocast rules)"]
    return result
