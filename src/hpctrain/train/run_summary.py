"""What a run says about itself: the banner at the start, advice on failure, the summary."""

from __future__ import annotations

import platform
import resource
import sys
import time
from functools import reduce
from pathlib import Path

import torch

from hpctrain.config import Strategy
from hpctrain.monitor.meter import add_energy, energy_of, job_means
from hpctrain.parallel.processes import straggler
from hpctrain.runs.directory import RunDir
from hpctrain.tasks.spec import Measured
from hpctrain.train.checkpoints.checkpoint import checkpoint_path
from hpctrain.train.checkpoints.interval import FIRST_SAVE_SECONDS
from hpctrain.train.compilation import graph_skip_reasons, recompile_reasons
from hpctrain.train.hardware.mfu import model_flops_utilisation, peak_source
from hpctrain.version import __version__


def banner(parts, resume_from: Path | None) -> str:
    p, c, env = parts.plan, parts.config, parts.distributed.env
    lines = [
        f"hpctrain: run {parts.run_dir}" + (f" (resuming {resume_from.name})" if resume_from
                                           else ""),
        f"  device {p.device} ({p.device_name}), precision {p.precision}, channels_last "
        f"{p.channels_last}, compile {p.compile}"
        + (f" ({p.compile_mode})" if p.compile else "") + f", cudnn.benchmark {p.cudnn_benchmark}"
        + (f", cudnn attention {p.cudnn_attention}" if p.device.startswith("cuda") else "")
        + (f" ({p.note})" if p.note else ""),
        *([f"  {p.compile_note}"] if p.compile_note else []),
        *([f"  compiled kernels: {parts.compile_cache}"] if parts.compile_cache else []),
        f"  task {parts.task.name}, model {c.model.name} "
        f"({parts.model_flops.parameters / 1e6:.2f} M parameters), data {c.data.dataset} "
        f"({len(parts.data.train_loader.dataset)} train"
        + (f" / {len(parts.data.val_loader.dataset)} val" if parts.task.evaluates else "")
        + f" {_samples(parts)}, "
        f"{parts.data.num_workers} workers per process)",
        f"  global batch {parts.global_batch_size} (batch {parts.batch_size} x "
        f"{parts.distributed.layout.data} process(es) x accumulation "
        f"{c.train.grad_accum_steps}), "
        f"{parts.total_steps} steps, {parts.optimizer_note}",
    ]
    if dropped := _left_out(parts):
        lines.append(f"  {dropped}")
    lines += [f"  {note}" for note in parts.data.notes]
    if c.task_spec.steps_model:  # what its callbacks become
        lines += [f"  {note}" for note in parts.model.notes]
    if getattr(parts.model, "pretrained_note", None):
        lines.append(f"  weights: {parts.model.pretrained_note}")
    if env.world_size > 1:
        lines.append(f"  {env.world_size} processes ({env.launcher}, {env.num_nodes} node(s) x "
                     f"{env.local_world_size}), {parts.distributed.layout.describe()}")
    if parts.step.pipeline is not None:
        lines.append(f"  pipeline: {parts.step.pipeline.describe()}")
    if not parts.task.evaluates:
        lines.append("  evaluation: none (the module has no validation_step: no validation "
                     "loop, as under Lightning)")
    elif parts.fused_eval is not None:
        lines.append(f"  evaluation: {parts.fused_eval.describe()}")
    elif parts.unfused_why:
        lines.append(f"  evaluation unfused: {parts.unfused_why}")
    if parts.fp8 is not None:
        lines.append(f"  fp8: {parts.fp8.describe()}")
        if warning := parts.fp8.warning():
            lines.append(f"hpctrain: warning: {warning}")
    meter = parts.meter
    lines.append(f"  energy: {meter.energy_source}" + (f" ({meter.why_not})"
                                                       if meter.why_not else ""))
    if parts.pacer is not None:
        pacer = parts.pacer
        lines.append(f"  checkpoint.every=auto: the first save after {FIRST_SAVE_SECONDS:.0f} s "
                     "of training or at the epoch's end, then at Daly's interval for the "
                     f"measured save and one stop without a word per "
                     f"{pacer.mtbf_seconds / 3600:.3g} h ({pacer.stops} in this run's "
                     f"{pacer.hours:.3g} h, and a prior of one per {pacer.prior_hours:g} h)")
    if parts.deadline is not None:
        lines.append("  will save and stop at " + time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(parts.deadline)) + " (before the time limit)")
    return "\n".join(lines)


def _left_out(parts) -> str | None:
    """What each epoch leaves out of the training set (the last partial batch, or micro-batches
    short of a whole step), said; None where it trains on every sample."""
    try:
        samples = len(parts.data.train_loader.dataset)
    except TypeError:  # a stream: its epochs are its own
        return None
    trained = parts.steps_per_epoch * parts.global_batch_size
    if trained >= samples:
        return None
    keeping = "; a DataLoader with drop_last=False keeps a last smaller batch" \
        if parts.world_size == 1 else ""  # several processes: the sampler's, said apart
    return (f"each epoch trains on {trained} of the {samples} samples: the last "
            f"{samples - trained} make no whole step of {parts.global_batch_size} and are left "
            f"out (drop_last; a shuffled order leaves out others each epoch{keeping})")


def start_record(parts) -> dict:
    """This start of the run, as run.json keeps it (runs/identity.py)."""
    env = parts.distributed.env
    return {"time": time.time(), "claimed": parts.place.lock.claimed,
            "job_id": env.job_id, "restart": env.restart_count,
            "launcher": env.launcher, "world_size": parts.world_size,
            "hosts": sorted(set(parts.distributed.hosts)), "cluster": env.cluster,
            "gpu_model": parts.plan.device_name if parts.device.type == "cuda" else None,
            "gpus": parts.world_size if parts.device.type == "cuda" else 0,
            "output_dir": str(parts.run_dir.parent)}


def _samples(parts) -> str:
    said = parts.config.task_spec.describe(parts.config, parts.data.num_classes,
                                           parts.data.vocab_size)
    return f"{said} ({parts.data.classes_from})" if parts.data.classes_from else said


def oom_advice(parts, step: int) -> str:
    c = parts.config
    half = max(1, parts.batch_size // 2)
    tips = [f"train.batch_size={half} train.grad_accum_steps={c.train.grad_accum_steps * 2} "
            "(same global batch, half the activations)"]
    if not c.model.activation_checkpointing:
        tips.append("model.activation_checkpointing=true (recompute block activations)")
    if parts.plan.precision in ("fp32", "tf32"):
        tips.append("precision=bf16 (half-size activations)")
    if parts.world_size > 1 and parts.distributed.strategy == Strategy.DDP:
        tips.append("parallel.strategy=fsdp (shard parameters, gradients and optimiser state)")
    size = c.task_spec.sample_size
    if size is not None:  # your own tensors: sized by your code
        tips.append(f"a smaller {size} (now {reduce(getattr, size.split('.'), c)})")
    return (f"CUDA out of memory at step {step} with train.batch_size={parts.batch_size} "
            f"per device on {parts.plan.device_name} ({c.model.name}, precision "
            f"{parts.plan.precision}). Any of these lowers the peak:\n  " + "\n  ".join(tips))


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host_rss"


def totals(parts, progress, clock) -> dict:
    """The run's time, device-hours and energy until now: the jobs before this one (progress:
    as run.json records them, or their last checkpoint) and this one (its energy as of the
    last logging interval, rank 0's own up to now)."""
    job_seconds = time.perf_counter() - clock.started
    rows = list(clock.monitor_rows) or [[]]
    rows[0] = parts.meter.take(new_window=False)
    job_energy = energy_of(rows)
    return {"elapsed_seconds": progress.wall_seconds + job_seconds,
            "device_hours": progress.device_hours + job_seconds * parts.world_size / 3600,
            "energy_joules": add_energy(progress.energy_joules, job_energy),
            "job_seconds": job_seconds, "job_energy_joules": job_energy, "rows": rows}


def _energy_figures(parts, progress, run: dict) -> dict:
    joules = run["energy_joules"]
    samples = progress.step * parts.global_batch_size
    return {**job_means(run["rows"]), "energy_joules": joules,
            "energy_kwh": joules / 3.6e6 if joules is not None else None,
            "samples_per_joule": samples / joules if joules else None,
            "energy_source": parts.meter.energy_source}


def summary(parts, progress, clock, status: str, run: dict | None = None) -> dict:
    """The end-of-run figures. Time, device-hours and energy cover the whole run: the jobs
    before this one (as run.json records them) and this one (`run`: its totals, taken now
    when not given)."""
    run = run or totals(parts, progress, clock)
    job_seconds = run["job_seconds"]
    samples_per_second, units_per_second = _rates(parts, progress, clock)
    peak, peak_kind = _peak_memory(parts.device)
    rank_step = [s / clock.rank_steps for s in clock.rank_seconds] if clock.rank_steps else []
    return {
        "status": status,
        "stopped_early": progress.stopped_early,  # why a callback ended it early, if one did
        "task": parts.task.name,
        "best_val_accuracy": progress.best_val_accuracy,
        "final_val_accuracy": progress.final_val_accuracy,
        **parts.config.task_spec.figures(
            _measured(parts, progress, clock, samples_per_second, units_per_second)),
        "samples_per_second": samples_per_second,
        "data_wait_fraction": (min(1.0, clock.data_wait_seconds / clock.train_seconds)
                               if clock.train_seconds else None),  # two clocks: at most all
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "wall_seconds": run["elapsed_seconds"],
        "job_seconds": job_seconds,
        "steps": progress.step,
        "epochs": progress.step / parts.steps_per_epoch,
        "global_batch_size": parts.global_batch_size,
        "batch_size_per_device": parts.batch_size,
        "grad_accum_steps": parts.config.train.grad_accum_steps,
        "effective_lr": parts.effective_lr,
        "device": parts.plan.device_name,
        "world_size": parts.world_size,
        "strategy": parts.distributed.strategy,
        "layout": {dimension: getattr(parts.distributed.layout, dimension)
                   for dimension in ("data", "tensor", "pipeline")},
        "launcher": parts.distributed.env.launcher,
        "precision": parts.plan.precision,
        "device_hours": run["device_hours"],
        **_energy_figures(parts, progress, run),
        "restarts": progress.restarts,
        "best_checkpoints": _best_checkpoints(parts, progress),
        # checkpoint.every=auto's interval and what it was chosen from; None otherwise
        "checkpoint_interval": parts.pacer.describe() if parts.pacer is not None else None,
        "stop_seconds": clock.stop_seconds,
        "resumed_with_changes": progress.changes,
        "straggler": straggler(rank_step, parts.distributed.hosts),
        "skipped_images": parts.data.skipped_images,
        "compiled": _compiled(parts, clock),
        "system": parts.plan.as_dict(),
        "software": software(),
        "slurm_job_id": parts.distributed.env.job_id,
        "run_dir": str(parts.run_dir),
    }


def _compiled(parts, clock) -> dict | None:
    """What this job compiled (compile on): its seconds, graphs, recompilations and the
    latest reasons for them, and what its kept cache gave; None without compile."""
    if not parts.plan.compile:
        return None
    compiled = clock.compiled()
    reasons = list(dict.fromkeys(recompile_reasons()[::-1]))[:3][::-1] \
        if compiled["recompiles"] else []  # the latest three apart, newest last
    return {**compiled, "latest_recompile_reasons": [r[:200] for r in reasons],
            "cuda_graph_skip_reasons": list(dict.fromkeys(graph_skip_reasons()))[-3:]
            if compiled["cuda_graph_skips"] else []}


def _best_checkpoints(parts, progress) -> list[dict] | None:
    """A ModelCheckpoint's best checkpoints, the best first: their paths and monitored
    values (Lightning's best_k_models); None without one."""
    keep = parts.keep_best
    if keep is None:
        return None
    ranked = sorted(progress.kept_best, key=lambda pair: pair[1], reverse=keep.mode == "max")
    return [{"path": str(checkpoint_path(RunDir(parts.run_dir).checkpoints, step)),
             keep.monitor: value} for step, value in ranked]


def _rates(parts, progress, clock) -> tuple[float | None, float | None]:
    """Samples and task units (images, tokens) per second: steady (after the first interval)
    when the run had one, else over all training time."""
    if clock.steady_seconds > 0:
        return (clock.steady_samples / clock.steady_seconds,
                clock.steady_units / clock.steady_seconds)
    if not clock.train_seconds:
        return None, None
    samples = progress.step * parts.global_batch_size / clock.train_seconds
    return samples, samples * parts.config.task_spec.units_per_sample(parts.config)


def _measured(parts, progress, clock, samples_per_second, units_per_second) -> Measured:
    """What the task's own summary figures are chosen from (tasks/spec.py)."""
    spec, flops, plan = parts.config.task_spec, parts.model_flops, parts.plan
    mfu, peak = None, None  # a task without FLOPs per unit has no MFU: no peak is looked up
    if spec.flops_per_unit:
        mfu = model_flops_utilisation(spec.flops_per_unit(flops, parts.config),
                                      units_per_second, parts.world_size, plan)
        peak = peak_source(plan.device_name, plan.precision)
    return Measured(samples_per_second=samples_per_second, units_per_second=units_per_second,
                    best_val_loss=progress.best_val_loss, final_eval=progress.final_eval,
                    padding_fraction=clock.padding_fraction, parameters=flops.parameters,
                    mfu=mfu, mfu_peak=peak, mfu_formula=flops.formula)


def software() -> dict:
    """What ran it: enough to rebuild the environment or to tell two runs' setups apart."""
    return {"python": sys.executable, "python_version": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "hpctrain": __version__}
