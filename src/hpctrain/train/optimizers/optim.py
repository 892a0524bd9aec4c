"""Optimiser, batch-size LR scaling, the LR schedule and the EMA of weights.

SGD and AdamW come from torch (foreach, or fused on GPU), LARS and LAMB from timm. Norm and
bias parameters (every parameter with fewer than two dimensions) get no weight decay, as in
the large-batch ImageNet recipes. The schedule is one function of the step, wrapped in a
LambdaLR so its position is part of the checkpoint.
"""

from __future__ import annotations

import copy
import fnmatch
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from hpctrain.config import OptimConfig, ScheduleConfig
from hpctrain.errors import ConfigError


def scaled_lr(optim: OptimConfig, global_batch_size: int) -> float:
    """The base LR scaled to the global batch: linear (Goyal et al.) or square-root rule."""
    ratio = global_batch_size / optim.reference_batch_size
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[optim.lr_scaling]
    return optim.lr * factor


def param_groups(model: nn.Module, weight_decay: float, no_decay_norm_bias: bool,
                 lr: float | None = None, pretrained_lr_scale: float = 1.0) -> list[dict]:
    """The parameters with weight decay, then those without; each again parted into the
    tensor-parallel split ones (DTensors) and plain ones, as one foreach or fused kernel takes
    one kind (a split model's norms and biases, which no plan splits, are plain). Where
    pretrained weights were loaded (models/pretrained.py) and `pretrained_lr_scale` is below
    1, the pretrained parameters are a group of their own at `lr` x that scale."""
    replaced = getattr(model, "replaced_layers", None)
    lower = replaced is not None and pretrained_lr_scale < 1
    kinds: dict[tuple[bool, bool, bool], list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            decays = not (no_decay_norm_bias and param.ndim <= 1)
            pretrained = lower and not any(name == layer or name.startswith(layer + ".")
                                           for layer in replaced)
            kinds.setdefault((pretrained, not decays, isinstance(param, DTensor)),
                             []).append(param)
    return [{"params": params, "weight_decay": 0.0 if no_decay else weight_decay,
             **({"lr": lr * pretrained_lr_scale} if pretrained else {})}
            for (pretrained, no_decay, _), params in sorted(kinds.items(),
                                                            key=lambda kind: kind[0])]


def freeze(model: nn.Module, patterns: list[str]) -> None:
    """model.freeze: the parameters whose names match a pattern are not trained; a pattern
    that matches none is refused, naming a few parameters."""
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ConfigError(f"model.freeze: {pattern!r} matches no parameter of the model "
                              f"(its parameters are named like {', '.join(names[:3])}, ..., "
                              f"{names[-1]})")
        for name in matched:
            model.get_parameter(name).requires_grad_(False)


def build_optimizer(model: nn.Module, optim: OptimConfig, lr: float,
                    device: torch.device) -> torch.optim.Optimizer:
    """On a GPU SGD and AdamW are fused: the kernel itself skips a step fp16's loss scaler
    refuses, with no host-device synchronisation (torch's GradScaler asks the host for the
    others). Fused SGD's momentum starts as zeros, not on its first step: torch's kernel (2.11
    to 2.14 at least) allocates it there uninitialised and, when the scaler skips that step
    (the usual first fp16 step), never fills it, and the weights blew up a step later on an
    H200. Zeros are what the first step would have made of it (buffer = 0 x momentum + grad).
    optim.fused chooses otherwise (a Trainer's adamw_torch_fused on the CPU: the same
    rounding as the Trainer's run)."""
    groups = param_groups(model, optim.weight_decay, optim.no_decay_norm_bias, lr,
                          optim.pretrained_lr_scale)
    fused = device.type == "cuda" if optim.fused == "auto" else optim.fused
    fast = {"fused": True} if fused else {"foreach": True}
    if optim.name == "sgd":
        sgd = torch.optim.SGD(groups, lr=lr, momentum=optim.momentum,
                              nesterov=optim.nesterov and optim.momentum > 0, **fast)
        if optim.momentum > 0:
            for param in (p for group in sgd.param_groups for p in group["params"]):
                sgd.state[param]["momentum_buffer"] = torch.zeros_like(param)
        return sgd
    if optim.name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=optim.betas, eps=optim.eps, **fast)
    from timm.optim import Lamb, Lars

    if optim.name == "lars":
        return Lars(groups, lr=lr, momentum=optim.momentum, nesterov=optim.nesterov)
    return Lamb(groups, lr=lr, betas=optim.betas)


def lr_multiplier(schedule: ScheduleConfig, step: int, total_steps: int,
                  steps_per_epoch: int) -> float:
    """The fraction of the peak LR at optimiser step `step` (0-based)."""
    if schedule.name == "onecycle":
        rise = max(1, round(schedule.pct_start * total_steps))
        if step < rise:
            return 0.04 + 0.96 * step / rise  # from peak/25, as torch's OneCycleLR
        t = (step - rise) / max(1, total_steps - rise)
        return _cosine(t, schedule.min_lr_ratio)
    warmup = schedule.warmup(steps_per_epoch)
    if step < warmup:
        return (step if schedule.warmup_from_zero else step + 1) / warmup
    if schedule.name in ("cosine", "linear"):
        t = (step - warmup) / max(1, total_steps - warmup)
        floor = schedule.min_lr_ratio
        return _cosine(t, floor) if schedule.name == "cosine" else \
            max(floor, floor + (1 - floor) * (1 - t))
    if schedule.name == "step":
        epoch = step / steps_per_epoch
        return schedule.gamma ** sum(epoch >= m for m in schedule.milestones)
    return 1.0


def _cosine(t: float, floor: float) -> float:
    """Half a cosine from 1 at t=0 down to `floor` at t=1."""
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))


class StepSchedule(LambdaLR):
    """hpctrain's LR schedule: one function of the step (`lr_multiplier`)."""

    def restore(self, state: dict, settings: list[dict]) -> None:
        """A resume's position (`state`: the checkpoint's, read through SCHEDULER_RULES) with
        this run's hyper-parameters (`settings`, its param groups' before the checkpoint was
        loaded): the base LRs this run's, each group's LR that of the saved step."""
        own = self.state_dict()  # only what this schedule holds: never another attribute
        self.load_state_dict({k: v for k, v in state.items() if k in own})
        self.base_lrs = [values["initial_lr"] for values in settings]
        groups = self.optimizer.param_groups
        for group, base, rule in zip(groups, self.base_lrs, self.lr_lambdas):
            group["lr"] = base * rule(self.last_epoch)
        self._last_lr = [group["lr"] for group in groups]


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: ScheduleConfig,
                    total_steps: int, steps_per_epoch: int) -> StepSchedule:
    return StepSchedule(optimizer, lambda step: lr_multiplier(schedule, step, total_steps,
                                                              steps_per_epoch))


class WeightEma:
    """Exponential moving average of the weights and float buffers, updated every step.

    Our own rather than torch's AveragedModel, whose update compares a device counter with 0
    on every call: a host-device synchronisation per step on GPUs. One foreach lerp instead.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        pairs = list(zip(self.module.state_dict().values(), model.state_dict().values()))
        self._ema_float = [e for e, _ in pairs if e.is_floating_point()]
        self._live_float = [m for e, m in pairs if e.is_floating_point()]
        self._other = [(e, m) for e, m in pairs if not e.is_floating_point()]

    @torch.no_grad()
    def update(self) -> None:
        torch._foreach_lerp_(self._ema_float, self._live_float, 1.0 - self.decay)
        for ema_tensor, live_tensor in self._other:  # counters such as num_batches_tracked
            ema_tensor.copy_(live_tensor)

    def state_dict(self) -> dict:
        return self.module.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state)
