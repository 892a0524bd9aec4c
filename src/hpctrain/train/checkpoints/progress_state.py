"""What a checkpoint carries of the run besides tensors (meta.json): the run's Progress, and
the rules meta.json must hold to be resumed from. A checkpoint whose meta.json breaks them is
damaged (safe_checkpoint.problem names it, and a resume sets it aside), never a traceback."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain.readers import (AMOUNT, COUNT, FINITE, MAPPING, NONE, NUMBER, TEXT, Kind,
                              field_problem, list_of, optional)


@dataclass
class Progress:
    """What a checkpoint carries besides the model and optimiser."""

    step: int = 0
    best_val_accuracy: float | None = None
    final_val_accuracy: float | None = None
    best_val_loss: float | None = None  # language models
    final_eval: dict = field(default_factory=dict)  # the last evaluation's val_* figures
    eval_owed: int | None = None  # the step whose scheduled evaluation a stop cut short
    last_good_checkpoint: str | None = None
    nan_intervals: int = 0
    nan_since_step: int | None = None
    # the jobs before this one: as run.json's starts record them (run_record.announce), or as the
    # checkpoint does (up to its save) where they ran an hpctrain that kept no job figures
    restarts: int = 0
    wall_seconds: float = 0.0
    device_hours: float = 0.0  # devices x hours
    energy_joules: float | None = None  # all devices (None: never measured)
    changes: list = field(default_factory=list)  # [{"step", "settings"}] applied on resume
    # metrics.jsonl's size when the checkpoint was saved: what came after belongs to steps
    # and evaluations a resume from it does again (None: a checkpoint of an older hpctrain)
    metrics_bytes: int | None = None
    # why the run ended before its last step, as completed (a callback's trainer.should_stop)
    stopped_early: str | None = None
    # ModelCheckpoint's best checkpoints, [step, monitored value] in the order saved: kept
    # besides the last ones
    kept_best: list = field(default_factory=list)

    @classmethod
    def from_record(cls, record: dict) -> Progress:
        """From meta.json's `progress`, checked by PROGRESS_RULES (a field of a later
        hpctrain's is left out; one missing takes its default, as in older checkpoints)."""
        return cls(**{k: v for k, v in record.items() if k in PROGRESS_RULES})


CHANGE = Kind("a change record", lambda v: isinstance(v, dict) and COUNT.holds(v.get("step"))
              and list_of(TEXT).holds(v.get("settings")))
PROGRESS_RULES = {
    "step": COUNT, "best_val_accuracy": optional(NUMBER), "final_val_accuracy": optional(NUMBER),
    "best_val_loss": optional(NUMBER), "final_eval": MAPPING, "eval_owed": optional(COUNT),
    "last_good_checkpoint": optional(TEXT), "nan_intervals": COUNT,
    "nan_since_step": optional(COUNT), "restarts": COUNT, "wall_seconds": AMOUNT,
    "device_hours": AMOUNT, "energy_joules": optional(AMOUNT), "changes": list_of(CHANGE),
    "metrics_bytes": optional(COUNT), "stopped_early": optional(TEXT),
    "kept_best": list_of(Kind("a [step, value] pair", lambda v: isinstance(v, list) and len(
        v) == 2 and COUNT.holds(v[0]) and FINITE.holds(v[1]))),
}
# a param group's settings as a LightningModule's schedules left them: numbers, or lists of
# numbers (Adam's betas)
GROUP_SETTINGS = Kind("a mapping of finite numbers or lists of them", lambda v: isinstance(
    v, dict) and all(FINITE.holds(x) or list_of(FINITE).holds(x) for x in v.values()))
# the LR schedule's position (torch's LambdaLR.state_dict): only what hpctrain's schedule
# holds; a LightningModule's (tasks/lightning_optim.py): the step, its
# schedulers' states and its optimiser's groups' settings
SCHEDULER_RULES = {
    "last_epoch": Kind("a whole number from -1", lambda v: isinstance(v, int) and
                       not isinstance(v, bool) and v >= -1),
    "_step_count": COUNT, "base_lrs": list_of(FINITE), "_last_lr": list_of(FINITE),
    "lr_lambdas": list_of(NONE),  # hpctrain's rules are functions, saved as null
    "schedulers": list_of(MAPPING), "groups": list_of(GROUP_SETTINGS),
}
# fp16's loss scaler (torch's GradScaler.state_dict); empty for the other precisions
SCALER_RULES = {"scale": AMOUNT, "growth_factor": AMOUNT, "backoff_factor": AMOUNT,
                "growth_interval": COUNT, "_growth_tracker": COUNT}


def meta_problem(meta: dict) -> str | None:
    """What in meta.json breaks the rules a resume relies on ('progress.step is "x", not ...'),
    or None."""
    why = field_problem(meta, {"progress": MAPPING, "scheduler": MAPPING, "scaler": MAPPING,
                               "global_batch_size": COUNT, "config": MAPPING},
                        ("progress", "scheduler", "scaler", "global_batch_size"))
    if why is not None:
        return why
    for section, rules, required in (
            ("progress", PROGRESS_RULES, ("step",)),
            ("scheduler", SCHEDULER_RULES, ("last_epoch",)),
            ("scaler", SCALER_RULES, tuple(SCALER_RULES) if meta["scaler"] else ())):
        if (why := field_problem(meta[section], rules, required)) is not None:
            return f"{section}.{why}"
    if meta["progress"]["step"] != meta.get("step"):
        return "progress.step is not the checkpoint's step"
    return None

