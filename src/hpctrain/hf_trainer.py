"""What Hugging Face's `Trainer` is given, as `hpctrain.fit` takes it: `fit(model,
args=TrainingArguments(...), train_dataset=..., eval_dataset=..., data_collator=...)`.

Every field of TrainingArguments is read: those with a meaning here become hpctrain's
settings (`translate`, a table read top to bottom: TRANSLATED), those that change nothing
here are named (NO_EFFECT), and any other set away from its default is refused by name, so
that a script never trains otherwise than it says without a word. The loaders are made as
the Trainer makes them (its batch sizes, order, drop_last, workers, collator, the columns
its model does not take removed), then kept by fit as any DataLoader you give it
(data/given_loaders.py). Your own keyword settings to fit win over the translation.

Known differences, said in docs/huggingface.md: a random order is hpctrain's sampler's, not
the Trainer's permutation; `lr` in metrics.jsonl is the rate after the step (the next
step's); parameters kept from weight decay are the 1-D ones (biases and norms), where the
Trainer names them by module and name (the same set in the library's models).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from hpctrain.errors import ConfigError
from hpctrain.tasks.tensors import LABELS, forward_keywords

# schedules as Trainer names them (lr_scheduler_type) -> hpctrain's schedule.name; HF's
# "constant" has no warmup, whatever warmup_steps says
SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant",
             "constant_with_warmup": "constant", "cosine_with_min_lr": "cosine"}
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")
SINKS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}

# fit's settings for a Hugging Face model given without TrainingArguments: the Trainer's
# defaults that shape the training (its logging, saving and seed stay hpctrain's, and so does
# the precision: bf16 where the device has it)
TRAINER_DEFAULTS = {"optim.name": "adamw", "optim.lr": 5e-5, "optim.weight_decay": 0.0,
                    "optim.grad_clip_norm": 1.0, "schedule.name": "linear",
                    "schedule.warmup_from_zero": True, "train.epochs": 3,
                    "train.batch_size": 8, "train.label_smoothing": 0.0}

# what Trainer takes besides its arguments and data that fit has no place for
TRAINER_ONLY = {
    "model_init": "build the model before calling fit",
    "compute_loss_func": "return the loss from the model's forward (its `loss` output)",
    "optimizers": "set optim.* and schedule.* (or let args say them)",
    "optimizer_cls_and_kwargs": "set optim.*",
    "preprocess_logits_for_metrics": "reduce the logits in compute_metrics",
}

# fields that change nothing in how hpctrain trains: logging's looks, what the Trainer does
# beside training, and what only moves batches faster (hpctrain's data.* sets that)
NO_EFFECT = frozenset({
    "disable_tqdm", "log_level", "log_level_replica", "log_on_each_node", "logging_dir",
    "logging_first_step", "logging_nan_inf_filter", "skip_memory_metrics", "do_train",
    "do_eval", "do_predict", "save_on_each_node", "save_only_model", "overwrite_output_dir",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "local_rank", "ddp_timeout", "ddp_backend", "project", "trackio_space_id",
    "trackio_bucket_id", "trackio_static_space_id", "include_num_input_tokens_seen",
    "use_cache", "length_column_name", "hub_token", "hub_private_repo", "hub_model_id",
    "hub_strategy", "hub_always_push", "hub_revision", "push_to_hub_model_id",
    "push_to_hub_organization", "push_to_hub_token", "half_precision_backend",
    "save_safetensors",
})


def is_hf_model(model) -> bool:
    """Whether `model` is a transformers PreTrainedModel (transformers is not imported)."""
    return any(cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers")
               for cls in type(model).__mro__)


def translate(args, steps_per_epoch: int) -> dict:
    """hpctrain's settings for `args` (a TrainingArguments), as dotted keys; a ConfigError
    names each field set that has no meaning here. `steps_per_epoch`: the optimiser steps of
    an epoch, which the Trainer's epoch-wise intervals and warmup ratio count in."""
    refused = [f"{name}={value!r}" for name, value in changed(args).items()
               if name not in TRANSLATED and name not in NO_EFFECT]
    if refused:
        raise ConfigError(f"fit(args=TrainingArguments(...)): hpctrain has no meaning for "
                          f"{', '.join(refused)}: leave them at their defaults (docs/"
                          "huggingface.md says what each field of TrainingArguments becomes)")
    settings = {}
    for part in (_optimiser, _schedule, _length, _precision, _intervals, _run):
        settings.update(part(args, steps_per_epoch))
    return settings


def changed(args) -> dict:
    """The fields of `args` away from a default TrainingArguments' (as its own checks leave
    both)."""
    default = type(args)(output_dir=args.output_dir)
    return {field.name: getattr(args, field.name) for field in dataclasses.fields(args)
            if field.init and getattr(args, field.name) != getattr(default, field.name)}


def _optimiser(args, steps_per_epoch: int) -> dict:
    if _word(args.optim) not in OPTIMIZERS:
        raise ConfigError(f"TrainingArguments(optim={_word(args.optim)!r}): hpctrain trains "
                          f"with {' or '.join(OPTIMIZERS)} (torch's AdamW) of the Trainer's "
                          "optimisers; set optim.name for hpctrain's others")
    fused = _word(args.optim) == "adamw_torch_fused"
    return {"optim.name": "adamw", "optim.fused": fused, "optim.lr": args.learning_rate,
            "optim.lr_scaling": "none",
            "optim.betas": [args.adam_beta1, args.adam_beta2], "optim.eps": args.adam_epsilon,
            "optim.weight_decay": args.weight_decay, "optim.no_decay_norm_bias": True,
            "optim.grad_clip_norm": args.max_grad_norm or None,
            "train.label_smoothing": args.label_smoothing_factor}


def _schedule(args, steps_per_epoch: int) -> dict:
    kind = _word(args.lr_scheduler_type)
    if kind not in SCHEDULES:
        raise ConfigError(f"TrainingArguments(lr_scheduler_type={kind!r}): hpctrain has "
                          f"{', '.join(SCHEDULES)} of the Trainer's schedules")
    extra = dict(args.lr_scheduler_kwargs or {})
    floor = extra.pop("min_lr_rate", 0.0) if kind == "cosine_with_min_lr" else 0.0
    if extra:
        raise ConfigError(f"TrainingArguments(lr_scheduler_kwargs={args.lr_scheduler_kwargs!r})"
                          f": hpctrain has no meaning for {', '.join(extra)} of {kind}")
    warmup = 0 if kind == "constant" else \
        args.get_warmup_steps(_total_steps(args, steps_per_epoch))
    return {"schedule.name": SCHEDULES[kind], "schedule.warmup_steps": warmup,
            "schedule.warmup_from_zero": True, "schedule.min_lr_ratio": floor}


def _length(args, steps_per_epoch: int) -> dict:
    return {"train.epochs": args.num_train_epochs, "seed": args.seed,
            "train.max_steps": args.max_steps if args.max_steps > 0 else None,
            "train.grad_accum_steps": args.gradient_accumulation_steps,
            "data.val_batch_size": args.per_device_eval_batch_size,
            # the Trainer's 0 (batches made in the training process) is its default, not a
            # choice: hpctrain's own count then, which changes nothing but the speed
            "data.num_workers": args.dataloader_num_workers or "auto",
            "deterministic": args.full_determinism}


def _precision(args, steps_per_epoch: int) -> dict:
    """bf16 or fp16 where the arguments ask; fp32 (tf32 where they ask it) otherwise, as the
    Trainer trains; the banner says what precision=auto would choose."""
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else \
        "tf32" if args.tf32 else "fp32"
    settings = {"precision": precision, "compile": bool(args.torch_compile),
                "model.activation_checkpointing": bool(args.gradient_checkpointing)}
    if args.torch_compile:  # torch's default mode where the arguments name none, as theirs
        settings["compile_mode"] = args.torch_compile_mode or "default"
    if args.use_cpu or getattr(args, "no_cuda", False):  # (no_cuda: transformers 4's)
        settings["device"] = "cpu"
    return settings


def _intervals(args, steps_per_epoch: int) -> dict:
    """Logging, evaluation and saving, each every N steps or every epoch."""
    log = _word(args.logging_strategy)
    evaluation = _word(args.eval_strategy)
    save = _word(args.save_strategy)
    settings = {"train.log_every": steps_per_epoch if log == "epoch" else
                max(1, _steps(args.logging_steps, args, steps_per_epoch))}
    if evaluation == "steps":
        settings["train.eval_every_steps"] = _steps(args.eval_steps or args.logging_steps,
                                                    args, steps_per_epoch)
    else:  # "no" evaluates once, at the end, as every completed run does here
        settings["train.eval_every_epochs"] = 1 if evaluation == "epoch" else 1e6
    if save == "steps":
        settings.update({"checkpoint.every_steps": _steps(args.save_steps, args,
                                                          steps_per_epoch),
                         "checkpoint.every_epochs": None})
    elif save == "no":  # only at a stop (preemption, the time limit) and the end
        settings.update({"checkpoint.every_steps": None, "checkpoint.every_epochs": 1e6})
    else:
        settings.update({"checkpoint.every_steps": None, "checkpoint.every_epochs": 1})
    if args.save_total_limit:
        settings["checkpoint.keep_last"] = args.save_total_limit
    return settings


def _steps(value: float, args, steps_per_epoch: int) -> int:
    """An interval of TrainingArguments in steps: below 1, a share of the run's steps."""
    if value >= 1:
        return int(value)
    return max(1, math.ceil(_total_steps(args, steps_per_epoch) * value))


def _total_steps(args, steps_per_epoch: int) -> int:
    """The run's optimiser steps as the Trainer counts them: max_steps, else the epochs'."""
    return args.max_steps if args.max_steps > 0 else \
        math.ceil(args.num_train_epochs * steps_per_epoch)


def _run(args, steps_per_epoch: int) -> dict:
    settings = {}
    if args.output_dir:
        settings["output_dir"] = str(args.output_dir)
    if args.run_name and args.run_name != args.output_dir:
        settings["run_name"] = args.run_name
    sinks = [_word(sink) for sink in (args.report_to or [])]
    if "all" in sinks:
        sinks = ["tensorboard"]
    unknown = [sink for sink in sinks if sink not in SINKS and sink != "none"]
    if unknown:
        raise ConfigError(f"TrainingArguments(report_to={args.report_to!r}): hpctrain reports "
                          f"to {', '.join(SINKS)}, not {', '.join(unknown)}")
    settings["tracking.sinks"] = [SINKS[sink] for sink in sinks if sink in SINKS]
    return settings


def _word(value) -> str:
    """An enum's value (IntervalStrategy.STEPS: "steps"), or the string itself."""
    return str(getattr(value, "value", value))


TRANSLATED = frozenset({
    "output_dir", "run_name", "report_to", "optim", "learning_rate", "adam_beta1",
    "adam_beta2", "adam_epsilon", "weight_decay", "max_grad_norm", "label_smoothing_factor",
    "lr_scheduler_type", "warmup_steps", "num_train_epochs", "max_steps", "seed",
    "gradient_accumulation_steps", "per_device_train_batch_size", "per_device_eval_batch_size",
    "full_determinism", "bf16", "fp16", "tf32", "torch_compile", "torch_compile_mode",
    "gradient_checkpointing", "use_cpu", "no_cuda", "logging_strategy", "logging_steps",
    "eval_strategy", "evaluation_strategy", "eval_steps", "save_strategy", "save_steps",
    "save_total_limit", "warmup_ratio", "lr_scheduler_kwargs", "dataloader_drop_last",
    "dataloader_num_workers", "train_sampling_strategy", "group_by_length",
    "remove_unused_columns", "label_names",
})


def loaders(args, model, train_dataset, eval_dataset, collate: Callable | None):
    """(train loader, validation loader or None, whether batches go by length) as the
    Trainer makes them: its batch sizes, order, drop_last, workers and collator, the samples'
    keys its model does not take left out (remove_unused_columns)."""
    from torch.utils.data import DataLoader, IterableDataset

    labels = list(args.label_names or [LABELS])
    if labels != [LABELS]:
        raise ConfigError(f"TrainingArguments(label_names={args.label_names!r}): hpctrain "
                          "reads the target under `labels` (or label, targets, target)")
    if collate is not None and args.remove_unused_columns:
        collate = ColumnsTaken(collate, taken_keys(model))
    strategy = _word(getattr(args, "train_sampling_strategy", "random"))
    by_length = strategy == "group_by_length" or bool(getattr(args, "group_by_length", False))
    if strategy not in ("random", "sequential", "group_by_length"):
        raise ConfigError(f"TrainingArguments(train_sampling_strategy={strategy!r}): hpctrain "
                          "draws random, sequential or group_by_length batches")
    common = {"collate_fn": collate, "num_workers": args.dataloader_num_workers,
              "drop_last": args.dataloader_drop_last}
    stream = isinstance(train_dataset, IterableDataset)  # its own order, as the Trainer's
    train = DataLoader(train_dataset, batch_size=args.per_device_train_batch_size,
                       shuffle=strategy != "sequential" and not stream, **common)
    val = None if eval_dataset is None else DataLoader(
        eval_dataset, batch_size=args.per_device_eval_batch_size, shuffle=False, **common)
    return train, val, by_length


def taken_keys(model) -> frozenset[str]:
    """The keywords the model's forward takes, and the names the Trainer's collators read
    the target under."""
    return forward_keywords(model) | {LABELS, "label", "label_ids"}


class ColumnsTaken:
    """Your collator, given each sample without the keys the model does not take (the
    Trainer's remove_unused_columns: a text column beside the tokens)."""

    def __init__(self, collate: Callable, keys: frozenset[str]):
        self.collate, self.keys = collate, keys
        self.__name__ = getattr(collate, "__name__", type(collate).__name__)

    def __call__(self, samples: list):
        return self.collate([{k: v for k, v in sample.items() if k in self.keys}
                             if isinstance(sample, Mapping) else sample
                             for sample in samples])


def from_trainer(model, args, given: dict, overrides: dict) -> tuple:
    """(train data, validation data, collate function, settings) for fit, from what a
    Trainer is given (`given`: train_dataset, eval_dataset, data_collator, processing_class
    and fit's own names for them) and fit's keyword settings (`overrides`, which win)."""
    from hpctrain.config import flatten

    wrong = [name for name in overrides if name in TRAINER_ONLY]
    if wrong:
        raise ConfigError("; ".join(f"fit({name}=...): hpctrain takes no {name}: "
                                    f"{TRAINER_ONLY[name]}" for name in wrong))
    train, val, collate = _one_of(given, "train_data", "train_dataset"), \
        _one_of(given, "val_data", "eval_dataset"), _one_of(given, "collate_fn", "data_collator")
    if collate is None:
        collate = _default_collator(given.get("processing_class"), args)
    if args is None:
        return train, val, collate, overrides
    if train is None or hasattr(train, "batch_size") and hasattr(train, "collate_fn"):
        raise ConfigError("fit(args=TrainingArguments(...)): give train_dataset, a Dataset "
                          "(the arguments say how to batch it, as the Trainer's)")
    train, val, by_length = loaders(args, model, train, val, collate)
    settings = translate(args, max(1, len(train) // args.gradient_accumulation_steps))
    if by_length:
        settings["data.bucketing"] = True
    return train, val, None, {**settings, **flatten(overrides)}


def _one_of(given: dict, mine: str, trainers: str):
    """What fit's argument `mine` or the Trainer's `trainers` gives, refused when both do."""
    if given.get(mine) is not None and given.get(trainers) is not None:
        raise ConfigError(f"fit(): give {mine} or {trainers} (the Trainer's name), not both")
    return given.get(mine) if given.get(mine) is not None else given.get(trainers)


def _default_collator(processing_class, args):
    """The Trainer's collator where none is given: padding by the tokenizer
    (processing_class), else transformers' default_data_collator; None (torch's collation)
    without TrainingArguments nor a tokenizer."""
    if processing_class is None and args is None:
        return None
    from transformers import DataCollatorWithPadding, default_data_collator

    if processing_class is not None and hasattr(processing_class, "pad"):
        return DataCollatorWithPadding(processing_class)
    return default_data_collator
