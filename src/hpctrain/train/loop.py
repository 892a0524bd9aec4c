"""The training loop: build everything from one Config, then train, evaluate, checkpoint.

Read it top to bottom: `train()` builds the parts and hands them to `_run_steps`, whose inner
loop is the training step. Inside the step nothing waits for the device: loss and accuracy
accumulate in device tensors (`RunningMetrics`) and are read back once per logging interval.
"""

from __future__ import annotations

import dataclasses
import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from hpctrain.config import Config, to_yaml
from hpctrain.data.loader import DataBundle, DeviceBatcher, build_data, image_size_for_epoch
from hpctrain.errors import DataError, RunFailed
from hpctrain.models.checkpointing import enable_activation_checkpointing
from hpctrain.models.registry import build_model
from hpctrain.train import checkpoint as ckpt
from hpctrain.train.optim import WeightEma, build_optimizer, build_scheduler, scaled_lr
from hpctrain.train.precision import Precision
from hpctrain.train.run_dir import resolve_run
from hpctrain.train.system import SystemPlan, apply_global_switches, plan_system
from hpctrain.train.telemetry import Telemetry, write_summary


@dataclass
class Parts:
    """Everything the loop needs, built once."""

    config: Config
    plan: SystemPlan
    device: torch.device
    run_dir: Path
    resume_from: Path | None
    data: DataBundle
    model: nn.Module  # the plain module: its state_dict is what checkpoints hold
    forward: nn.Module  # the module the step calls (compiled when compile is on)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    precision: Precision
    ema: WeightEma | None
    batcher: DeviceBatcher
    criterion: nn.Module
    steps_per_epoch: int
    total_steps: int
    world_size: int
    global_batch_size: int
    effective_lr: float


@dataclass
class Progress:
    """What a checkpoint carries besides the model and optimiser."""

    step: int = 0
    best_val_accuracy: float | None = None
    final_val_accuracy: float | None = None
    last_good_checkpoint: str | None = None
    nan_intervals: int = 0
    nan_since_step: int | None = None


@dataclass
class Clock:
    """Training time (evaluation and checkpointing excluded) and time spent waiting for data."""

    started: float = field(default_factory=time.perf_counter)
    train_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    steady_seconds: float = 0.0  # after the first logging interval (warm-up, compilation)
    steady_images: int = 0


class RunningMetrics:
    """Loss and accuracy sums kept on the device; `read()` is the only synchronisation."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(3, device=self.device)  # loss, correct, non-finite count
        self.samples = 0
        self.micro_steps = 0

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        finite = torch.isfinite(loss)
        correct = (logits.argmax(dim=1) == labels).sum()
        self.sums += torch.stack([torch.where(finite, loss, 0.0), correct, ~finite])
        self.samples += labels.shape[0]
        self.micro_steps += 1

    def read(self) -> dict:
        loss_sum, correct, nonfinite = self.sums.tolist()
        finite_steps = self.micro_steps - nonfinite
        values = {
            "loss": loss_sum / finite_steps if finite_steps else math.nan,
            "accuracy": correct / max(self.samples, 1),
            "all_nonfinite": nonfinite == self.micro_steps and self.micro_steps > 0,
        }
        self.reset()
        return values


def build_parts(config: Config) -> Parts:
    plan = plan_system(config)
    apply_global_switches(plan, config.seed)
    device = torch.device(plan.device)
    run_dir, resume_from = resolve_run(config)
    train_cfg = config.train
    data = build_data(config.data, train_cfg.batch_size, config.seed, device)

    model = build_model(config.model.name, data.num_classes, config.model.kwargs)
    if config.model.activation_checkpointing:
        model = enable_activation_checkpointing(model, config.model.name)
    memory_format = torch.channels_last if plan.channels_last else torch.preserve_format
    model = model.to(device=device, memory_format=memory_format)
    forward = torch.compile(model, mode=config.compile_mode) if plan.compile else model

    world_size = 1
    global_batch = train_cfg.batch_size * train_cfg.grad_accum_steps * world_size
    lr = scaled_lr(config.optim, global_batch)
    steps_per_epoch = len(data.train_loader) // train_cfg.grad_accum_steps
    if steps_per_epoch == 0:
        raise DataError(f"one optimiser step needs {global_batch} samples but the training set "
                        f"has {len(data.train_loader.dataset)}; lower train.batch_size or "
                        "train.grad_accum_steps")
    total_steps = train_cfg.max_steps or math.ceil(train_cfg.epochs * steps_per_epoch)
    optimizer = build_optimizer(model, config.optim, lr, device)
    scheduler = build_scheduler(optimizer, config.schedule, total_steps, steps_per_epoch)
    return Parts(
        config=config, plan=plan, device=device, run_dir=run_dir, resume_from=resume_from,
        data=data, model=model,
        forward=forward, optimizer=optimizer, scheduler=scheduler,
        precision=Precision(plan.precision, device),
        ema=WeightEma(model, config.optim.ema.decay) if config.optim.ema.enabled else None,
        batcher=DeviceBatcher(device, config.data.mean, config.data.std, plan.channels_last),
        criterion=nn.CrossEntropyLoss(label_smoothing=train_cfg.label_smoothing),
        steps_per_epoch=steps_per_epoch, total_steps=total_steps, world_size=world_size,
        global_batch_size=global_batch, effective_lr=lr)


def train(config: Config) -> dict:
    """Train `config` to the end (or resume it) and return the summary."""
    parts = build_parts(config)
    resume_from = parts.resume_from
    progress = Progress()
    if resume_from is not None:
        progress = _restore(parts, resume_from)
    telemetry = Telemetry(parts.run_dir, parts.total_steps, progress.step, config.tensorboard)
    (parts.run_dir / "config.yaml").write_text(to_yaml(config))
    telemetry.message(_banner(parts, resume_from))
    clock = Clock()
    status = "failed"
    try:
        _run_steps(parts, progress, clock, telemetry)
        status = "completed"
    except torch.cuda.OutOfMemoryError:
        raise RunFailed(_oom_advice(parts, progress.step)) from None
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        telemetry.close()
        summary = _summary(parts, progress, clock, status)
        write_summary(parts.run_dir, summary)
    return summary


def _run_steps(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry) -> None:
    cfg = parts.config.train
    eval_every = max(1, round(cfg.eval_every_epochs * parts.steps_per_epoch))
    ckpt_cfg = parts.config.checkpoint
    ckpt_every = ckpt_cfg.every_steps or max(1, round((ckpt_cfg.every_epochs or 1e9)
                                                      * parts.steps_per_epoch))
    metrics = RunningMetrics(parts.device)
    interval_start, interval_images, first_interval = time.perf_counter(), 0, True
    interval_wait = 0.0
    params = [p for p in parts.model.parameters() if p.requires_grad]
    parts.model.train()

    while progress.step < parts.total_steps:
        epoch, batches = _start_epoch(parts, progress.step)
        for _ in range(progress.step % parts.steps_per_epoch, parts.steps_per_epoch):
            # ---- the training step: accumulate gradients over micro-batches, then step ----
            for _micro in range(cfg.grad_accum_steps):
                waited = time.perf_counter()
                images, labels = _next_batch(batches)
                clock.data_wait_seconds += time.perf_counter() - waited
                images, labels = parts.batcher(images, labels)
                with parts.precision.autocast():
                    logits = parts.forward(images)
                    loss = parts.criterion(logits, labels)
                parts.precision.backward(loss / cfg.grad_accum_steps)
                metrics.add(loss.detach(), logits.detach(), labels)
            parts.precision.step(parts.optimizer, params, parts.config.optim.grad_clip_norm)
            parts.scheduler.step()
            parts.optimizer.zero_grad(set_to_none=True)
            if parts.ema is not None:
                parts.ema.update()
            progress.step += 1
            interval_images += parts.global_batch_size
            # ---- read back, evaluate, checkpoint: only at intervals ----
            last = progress.step == parts.total_steps
            if progress.step % cfg.log_every == 0 or last:
                seconds = time.perf_counter() - interval_start
                clock.train_seconds += seconds
                if not first_interval:
                    clock.steady_seconds += seconds
                    clock.steady_images += interval_images
                waited = clock.data_wait_seconds - interval_wait
                _log_interval(parts, progress, metrics.read(), epoch, interval_images / seconds,
                              waited / seconds, telemetry)
                first_interval = False
                interval_start, interval_images = time.perf_counter(), 0
                interval_wait = clock.data_wait_seconds
            paused = time.perf_counter()  # evaluation and checkpoints are not training time
            if progress.step % eval_every == 0 or last:
                _evaluate_and_record(parts, progress, telemetry)
            if progress.step % ckpt_every == 0 or last:
                _save(parts, progress, telemetry)
            interval_start += time.perf_counter() - paused
            if last:
                break


def _start_epoch(parts: Parts, step: int):
    """Point the sampler at this epoch (and, on resume, at the first unseen batch)."""
    epoch, step_in_epoch = divmod(step, parts.steps_per_epoch)
    size = image_size_for_epoch(parts.config.data, epoch)
    samples_done = step_in_epoch * parts.config.train.grad_accum_steps \
        * parts.config.train.batch_size
    parts.data.train_sampler.set_epoch(epoch, size, start=samples_done)
    return epoch, iter(parts.data.train_loader)


def _next_batch(batches):
    try:
        return next(batches)
    except DataError as err:  # raised in a worker: keep the message, drop the worker traceback
        raise DataError(str(err).strip().splitlines()[-1].split("DataError: ", 1)[-1]) from None


def _log_interval(parts: Parts, progress: Progress, values: dict, epoch: int,
                  images_per_second: float, data_wait: float, telemetry: Telemetry) -> None:
    lr = parts.optimizer.param_groups[0]["lr"]
    if values.pop("all_nonfinite"):
        progress.nan_intervals += 1
        if progress.nan_since_step is None:
            progress.nan_since_step = max(0, progress.step - parts.config.train.log_every) + 1
        if progress.nan_intervals >= parts.config.train.nan_patience:
            raise RunFailed(
                f"the loss has been NaN/inf at every step since step {progress.nan_since_step} "
                f"(stopped at step {progress.step}). Last good checkpoint: "
                f"{progress.last_good_checkpoint or 'none saved yet'}. Try a lower optim.lr "
                f"(now {lr:.3g}), optim.grad_clip_norm=1.0, a longer schedule.warmup_epochs, "
                "or precision=bf16 instead of fp16.")
    else:
        progress.nan_intervals, progress.nan_since_step = 0, None
    record = {"loss": values["loss"], "train_accuracy": values["accuracy"], "lr": lr,
              "epoch": progress.step / parts.steps_per_epoch, "images_per_second":
              images_per_second, "data_wait_fraction": data_wait}
    telemetry.record("train", progress.step, record)
    telemetry.show(progress.step, f"epoch {epoch}  loss {values['loss']:.4f}  "
                                  f"{images_per_second:,.0f} img/s  data wait {data_wait:.0%}")


@torch.inference_mode()
def evaluate(parts: Parts, model: nn.Module) -> float:
    """Top-1 accuracy on the validation set; one read-back at the end."""
    model.eval()
    correct = torch.zeros((), device=parts.device, dtype=torch.long)
    total = 0
    for images, labels in parts.data.val_loader:
        images, labels = parts.batcher(images, labels)
        with parts.precision.autocast():
            logits = model(images)
        correct += (logits.argmax(dim=1) == labels).sum()
        total += labels.shape[0]
    model.train()
    return correct.item() / max(total, 1)


def _evaluate_and_record(parts: Parts, progress: Progress, telemetry: Telemetry) -> None:
    accuracy = evaluate(parts, parts.forward)
    progress.final_val_accuracy = accuracy
    progress.best_val_accuracy = max(accuracy, progress.best_val_accuracy or 0.0)
    values = {"val_accuracy": accuracy, "epoch": progress.step / parts.steps_per_epoch}
    if parts.ema is not None:
        values["val_accuracy_ema"] = evaluate(parts, parts.ema.module)
    telemetry.record("eval", progress.step, values)
    telemetry.message(f"step {progress.step}: val_accuracy {accuracy:.4f}"
                      + (f"  (EMA {values['val_accuracy_ema']:.4f})" if parts.ema else ""))


def _save(parts: Parts, progress: Progress, telemetry: Telemetry) -> None:
    """Save unless the weights went non-finite: a bad state never replaces a good one."""
    norm = torch.nn.utils.get_total_norm([p.detach() for p in parts.model.parameters()])
    if not torch.isfinite(norm):
        telemetry.message(f"step {progress.step}: weights are not finite, checkpoint skipped")
        return
    state = {
        "step": progress.step,
        "progress": dataclasses.asdict(progress),
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict(),
        "scaler": parts.precision.state_dict(),
        "ema": parts.ema.state_dict() if parts.ema is not None else None,
        "rng": ckpt.capture_rng(),
    }
    path = ckpt.save_checkpoint(parts.run_dir / "checkpoints", progress.step, state,
                                parts.config.checkpoint.keep_last)
    progress.last_good_checkpoint = str(path)


def _restore(parts: Parts, path: Path) -> Progress:
    state = ckpt.load_checkpoint(path)
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.scheduler.load_state_dict(state["scheduler"])
    parts.precision.load_state_dict(state["scaler"])
    if parts.ema is not None and state["ema"] is not None:
        parts.ema.load_state_dict(state["ema"])
    ckpt.restore_rng(state["rng"])
    progress = Progress(**state["progress"])
    progress.last_good_checkpoint = str(path)
    return progress


def _banner(parts: Parts, resume_from: Path | None) -> str:
    p, c = parts.plan, parts.config
    lines = [
        f"hpctrain: run {parts.run_dir}" + (f" (resuming {resume_from.name})" if resume_from
                                           else ""),
        f"  device {p.device} ({p.device_name}), precision {p.precision}, channels_last "
        f"{p.channels_last}, compile {p.compile}, cudnn.benchmark {p.cudnn_benchmark}",
        f"  model {c.model.name}, data {c.data.dataset} ({len(parts.data.train_loader.dataset)}"
        f" train / {len(parts.data.val_loader.dataset)} val, {parts.data.num_classes} classes, "
        f"{parts.data.num_workers} workers)",
        f"  global batch {parts.global_batch_size} (batch {c.train.batch_size} x accumulation "
        f"{c.train.grad_accum_steps}), {parts.total_steps} steps, {c.optim.name} effective lr "
        f"{parts.effective_lr:.4g} ({c.optim.lr_scaling} scaling)",
    ]
    return "\n".join(lines)


def _oom_advice(parts: Parts, step: int) -> str:
    c = parts.config
    half = max(1, c.train.batch_size // 2)
    tips = [f"train.batch_size={half} train.grad_accum_steps={c.train.grad_accum_steps * 2} "
            "(same global batch, half the activations)"]
    if not c.model.activation_checkpointing:
        tips.append("model.activation_checkpointing=true (recompute block activations)")
    if parts.plan.precision in ("fp32", "tf32"):
        tips.append("precision=bf16 (half-size activations)")
    tips.append(f"a smaller data.image_size (now {c.data.image_size})")
    return (f"CUDA out of memory at step {step} with train.batch_size={c.train.batch_size} "
            f"on {parts.plan.device_name} ({c.model.name}, precision {parts.plan.precision}). "
            "Any of these lowers the peak:\n  " + "\n  ".join(tips))


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host_rss"


def _summary(parts: Parts, progress: Progress, clock: Clock, status: str) -> dict:
    wall = time.perf_counter() - clock.started
    if clock.steady_seconds > 0:
        images_per_second = clock.steady_images / clock.steady_seconds
    else:
        images_per_second = (progress.step * parts.global_batch_size
                             / clock.train_seconds) if clock.train_seconds else None
    peak, peak_kind = _peak_memory(parts.device)
    return {
        "status": status,
        "best_val_accuracy": progress.best_val_accuracy,
        "final_val_accuracy": progress.final_val_accuracy,
        "images_per_second": images_per_second,
        "data_wait_fraction": (clock.data_wait_seconds / clock.train_seconds
                               if clock.train_seconds else None),
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "wall_seconds": wall,
        "steps": progress.step,
        "epochs": progress.step / parts.steps_per_epoch,
        "global_batch_size": parts.global_batch_size,
        "effective_lr": parts.effective_lr,
        "device": parts.plan.device_name,
        "world_size": parts.world_size,
        "precision": parts.plan.precision,
        "device_hours": wall * parts.world_size / 3600,
        "skipped_images": parts.data.skipped_images,
        "system": parts.plan.as_dict(),
        "run_dir": str(parts.run_dir),
    }
