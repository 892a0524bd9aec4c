"""What a checkpoint carries of a run, and bringing it back: the run's progress, the tensors,
and which changed settings a resume applies or refuses.

A resume may change how training goes on (LR, schedule, epochs, augmentation, workers,
precision, the number of processes): the checkpoint brings back the *state* (weights,
optimiser moments, the schedule's position, RNG), the configuration the *settings*. So a
changed `optim.lr` really trains at the new rate from the resumed step on, and the summary's
figures are what ran. What would make the saved state meaningless (another model, optimiser
or parameter grouping) is refused before anything is loaded, naming the setting.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_state_dict)

from hpctrain.config import Config, current_names, flatten
from hpctrain.errors import ConfigError
from hpctrain.monitor.meter import add_energy
from hpctrain.runs.directory import RunDir, run_of_checkpoint, size_of
from hpctrain.train.checkpoints import checkpoint as ckpt
from hpctrain.train.checkpoints.progress_state import Progress
from hpctrain.train.checkpoints.safe_checkpoint import DamagedCheckpoint, read_meta

# settings whose change makes a checkpoint's state unusable, and why
STATE_SETTINGS = {
    "model.name": "the weights belong to another model",
    "model.kwargs": "the weights belong to another shape of model",
    "optim.name": "the optimiser state belongs to another optimiser",
    "optim.no_decay_norm_bias": "the optimiser state is grouped differently",
    "optim.ema.enabled": "the checkpoint holds no EMA weights",
}
# where the run lives is not a change
LOCATION_SETTINGS = ("resume", "run_name", "output_dir")


# the optimiser's state and settings keyed by parameter name ("state.blocks.3.mlp.up.weight.
# exp_avg"), not by position in a param group: pipeline stages hold different parameters in
# their groups, and positions would collide in one checkpoint (torchtitan does the same)
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def tensor_state(parts) -> dict:
    """Model, optimiser (and EMA) state as DCP saves and loads it: keyed by parameter name,
    sharded under FSDP, so that any world size can read it back."""
    model_state, optim_state = get_state_dict(parts.model, parts.step.optimizer, options=FLAT)
    state = {"model": model_state, "optim": optim_state}
    if parts.step.ema is not None:
        state["ema"] = parts.step.ema.state_dict()
    return state


def save(parts, progress: Progress, elapsed: float, energy: float | None) -> bool:
    """Save the run's state at `progress.step` unless the weights went non-finite (a bad state
    never replaces a good one); False when skipped. `elapsed` and `energy` (joules, None: not
    measured): this job's so far, added to the run's totals in the checkpoint. Collective:
    every rank reaches the same decision (replicated or all-reduced norm)."""
    if not torch.isfinite(parts.distributed.weights_norm(parts.model)):
        return False
    _rank_checkpoint(parts, progress)
    parts.distributed.align_buffers(parts.model)
    totals = dataclasses.replace(
        progress, wall_seconds=progress.wall_seconds + elapsed,
        device_hours=progress.device_hours + elapsed * parts.world_size / 3600,
        energy_joules=add_energy(progress.energy_joules, energy),
        metrics_bytes=size_of(RunDir(parts.run_dir).metrics)  # rank 0's: it writes the file
        if parts.distributed.is_main else None)
    meta = {"progress": dataclasses.asdict(totals),
            "scheduler": parts.step.scheduler.state_dict(),
            "scaler": parts.step.precision.state_dict(),
            "global_batch_size": parts.global_batch_size,
            "strategy": parts.distributed.strategy,
            "config": parts.config.model_dump(mode="json")}
    module_state = parts.model.checkpoint_state() if parts.config.task_spec.steps_model \
        else None  # a LightningModule's on_save_checkpoint
    path = parts.checkpointer.save(progress.step, tensor_state(parts), meta, module_state)
    progress.last_good_checkpoint = str(path)
    return True


def _rank_checkpoint(parts, progress: Progress) -> None:
    """A ModelCheckpoint's best checkpoints, this epoch's end ranked in by its monitored
    figure (as ModelCheckpoint saves at each epoch's end); the checkpointer keeps them
    besides the last ones."""
    if parts.keep_best is not None and progress.step % parts.steps_per_epoch == 0:
        others = [pair for pair in progress.kept_best if pair[0] != progress.step]
        progress.kept_best = parts.model.ranked_checkpoints(others, progress.step,
                                                            bool(progress.final_eval))
    parts.checkpointer.protected = {step for step, _ in progress.kept_best}


def changed_settings(saved: dict, config: Config) -> dict[str, tuple]:
    """key -> (checkpoint's value, this run's value) for every setting that differs."""
    old, new = flatten(saved), flatten(config.model_dump(mode="json"))
    return {key: (old.get(key), new.get(key)) for key in sorted(old.keys() | new)
            if not key.startswith(LOCATION_SETTINGS) and old.get(key) != new.get(key)}


def _saved_config(meta: dict, path: Path) -> dict | None:
    """The configuration the checkpoint was trained with: its own record, or (checkpoints of
    older versions) the run's config.yaml."""
    saved = meta["config"] if isinstance(meta.get("config"), dict) else \
        RunDir(run_of_checkpoint(path)).read_config()
    return current_names(saved) if saved is not None else None


def refuse_state_changes(saved: dict, config: Config, path: Path) -> None:
    """A ConfigError naming the first change that makes the checkpoint's state unusable."""
    now = config.model_dump(mode="json")
    for key, why in STATE_SETTINGS.items():
        old, new = _dotted(saved, key), _dotted(now, key)
        if key == "optim.ema.enabled" and not (new and not old):
            continue  # dropping the EMA is fine; asking for one the checkpoint lacks is not
        if old != new:
            raise ConfigError(
                f"resume from {path}: {key} is {new!r} here but {old!r} in the checkpoint: "
                f"{why}. Resume with {key}={_as_override(old)}, or start a new run (another "
                "run_name, without resume)")


def _dotted(tree: dict, key: str):
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _as_override(value) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def restore(parts, path: Path) -> tuple[Progress, list[str]]:
    """Load `path` into the run's parts; its Progress and the settings that changed since
    (as 'key: old -> new'), which from now on apply."""
    meta = read_meta(path)
    if meta.get("global_batch_size") != parts.global_batch_size:
        raise ConfigError(
            f"{path} was trained with a global batch of {meta.get('global_batch_size')}, this "
            f"run has {parts.global_batch_size} ({parts.world_size} process(es)): the steps "
            f"would not mean the same. Resume with train.global_batch_size="
            f"{meta.get('global_batch_size')}, which splits it over any number of processes.")
    saved = _saved_config(meta, path)
    changes = changed_settings(saved, parts.config) if saved is not None else {}
    if saved is not None:
        refuse_state_changes(saved, parts.config, path)
    settings = [{k: v for k, v in group.items() if k != "params"}
                for group in parts.step.optimizer.param_groups]  # this run's, before loading
    state = tensor_state(parts)
    try:
        held = ckpt.saved_keys(path)
        names = _saved_names(state, _aliases(parts, held))
        read = {section: {saved: state[section][key] for key, saved in keys.items()}
                for section, keys in names.items()}
        # the checkpoint's own param groups, read (so a hostile value is refused) and unused
        read["optim"].update({k.removeprefix("optim."): 0 for k in held
                              if k.startswith("optim.param_groups.")})
        meta, rng = parts.checkpointer.load(path, read)
        for section, keys in names.items():  # DCP fills tensors in place, replaces the rest
            state[section].update({key: read[section][saved] for key, saved in keys.items()})
        set_state_dict(parts.model, parts.step.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=FLAT)
    except (RuntimeError, AssertionError, KeyError, ValueError) as err:
        raise _not_loadable(path, err, changes) from None
    if parts.step.ema is not None:
        parts.step.ema.load_state_dict(state["ema"])
    _apply_settings(parts, settings, meta["scheduler"])
    if parts.config.task_spec.steps_model:  # its on_load_checkpoint, at the saved step
        parts.model.restore_checkpoint_state(ckpt.read_module_state(path), str(path))
    parts.step.precision.load_state_dict(meta["scaler"])
    if rng is not None:
        ckpt.restore_rng(rng)
    progress = Progress.from_record(meta["progress"])
    progress.last_good_checkpoint = str(path)
    progress.restarts += 1
    described = [f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items()]
    if described:
        progress.changes.append({"step": progress.step, "settings": described})
    return progress, described


def _aliases(parts, saved: set[str]) -> dict[str, str]:
    """Parameters to read under another name: the last pipeline stage's copy of the GPT's
    tied output weight, from a checkpoint (`saved`: its keys) saved without a pipeline, which
    holds the one tied weight's optimiser state under the embedding's name only."""
    if parts.step.pipeline is None or not parts.step.pipeline.copies:
        return {}
    return {} if any(k.startswith("optim.state.head.weight.") for k in saved) else {
        "head.weight": "embed.weight"}


def _saved_names(state: dict, aliases: dict[str, str]) -> dict[str, dict[str, str]]:
    """section -> {key in `state`: the name the checkpoint holds it by} for what a resume
    reads: all but the optimiser's param groups, whose settings come from this run
    (_apply_settings) and whose number follows the layout (param_groups in optim.py)."""
    def saved(key: str) -> str:
        for name, other in aliases.items():
            key = re.sub(rf"(^|\.){re.escape(name)}(\.|$)", rf"\g<1>{other}\g<2>", key)
        return key
    return {section: {key: saved(key) for key in values
                      if not (section == "optim" and key.startswith("param_groups."))}
            for section, values in state.items()}


def _apply_settings(parts, settings: list[dict], scheduler_state: dict) -> None:
    """The checkpoint's schedule position with this run's hyper-parameters: its param groups
    brought back the saved LR, momentum, weight decay, and its scheduler the saved base LR."""
    for group, values in zip(parts.step.optimizer.param_groups, settings):
        group.update(values)
    parts.step.scheduler.restore(scheduler_state, settings)


def _not_loadable(path: Path, err: Exception, changes: dict) -> Exception:
    """Why a checkpoint that passed the file check could not be loaded: another shape of model
    or optimiser (a ConfigError naming the settings that differ), or damage within a file."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]
    if not any(word in str(err) for word in ("mismatch", "Missing key", "size", "shape")):
        return DamagedCheckpoint(f"checkpoint {path} could not be read ({first}); resume from "
                                 "an earlier checkpoint (resume=RUN/checkpoints/step_N)")
    shaping = [f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items()
               if key.startswith(("model.", "data.", "optim."))]
    return ConfigError(
        f"checkpoint {path} does not fit this run's model or optimiser ({first}). "
        + (f"Settings that differ from the checkpoint's: {'; '.join(shaping)}. "
           if shaping else "")
        + "Resume with the checkpoint's settings, or start a new run (another run_name)")


def is_complete(progress: Progress, total_steps: int) -> bool:
    """Every step trained (or a callback ended the run early) and the evaluation of the final
    weights written: a stop during that evaluation leaves the run to be resumed, not
    finished."""
    return (progress.step >= total_steps or progress.stopped_early is not None) and \
        progress.eval_owed is None


def completed_summary(parts, progress: Progress) -> dict:
    """The summary of a run that is already complete: the one it wrote when it finished, left
    as it is; or, if that is missing, the checkpoint's figures."""
    summary = RunDir(parts.run_dir).read_summary()
    if summary is not None and summary.get("status") == "completed":
        return summary
    return {"status": "completed", "steps": progress.step,
            "best_val_accuracy": progress.best_val_accuracy,
            "final_val_accuracy": progress.final_val_accuracy,
            "wall_seconds": progress.wall_seconds, "device_hours": progress.device_hours,
            "energy_joules": progress.energy_joules,
            "restarts": progress.restarts - 1, "run_dir": str(parts.run_dir)}
