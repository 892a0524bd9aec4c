"""What a search found: its trials, the best so far, the best configuration as a recipe
(best.yaml, which `hpctrain run SEARCH/best.yaml` trains), parameter importances (Optuna's
PED-ANOVA, its default: fANOVA would need scikit-learn), and two pictures: the optimisation
history and parallel coordinates.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from hpctrain.runs.directory import RunDir
from hpctrain.tune.space import override, parse_all, shown
from hpctrain.tune.study import Search, open_study, read_search
from hpctrain.tune.worker import trial_run_name
from hpctrain.writers import write_whole

BEST_RECIPE = "best.yaml"
RESULTS = "results.json"
HISTORY_PICTURE = "history.png"
PARALLEL_PICTURE = "parallel.png"


def nothing_running(folder: Path) -> bool:
    """No trial is running or waiting: the search has ended (for now)."""
    from optuna.trial import TrialState

    search = read_search(folder)
    study = open_study(folder, search, 0, parse_all(search.space), create=False)
    return not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,
                                                         TrialState.WAITING))


def trial_rows(study, folder: Path) -> list[dict]:
    """One row per trial: its state, value, parameters and what its run directory says."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        run_name = trial_run_name(trial)
        summary = RunDir(folder / run_name).read_summary() or {}
        rows.append({
            "trial": trial.number, "state": trial.state.name.lower(), "value": trial.value,
            "params": dict(trial.params), "run_dir": str(folder / run_name),
            "steps": summary.get("steps"), "device_hours": summary.get("device_hours"),
            "energy_joules": summary.get("energy_joules"),
            "evaluations": len(trial.intermediate_values),
            "retry_of": trial.user_attrs.get("retry_of")})
    return rows


def best_trial(study):
    """The best completed trial, or None before the first completes."""
    try:
        return study.best_trial
    except ValueError:
        return None


def importances(study) -> dict[str, float] | None:
    """Each parameter's importance to the objective (Optuna's PED-ANOVA, which compares the
    best trials' parameters with all trials'), summing to 1; None with fewer than two
    completed trials."""
    import optuna
    from optuna.trial import TrialState

    if len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) < 2:
        return None
    try:
        with warnings.catch_warnings():  # "importances will be equal": said by the figures
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError):  # e.g. every trial has the same value
        return None
    return {key: float(value) for key, value in found.items()}


def write_best_recipe(search: Search, trial, folder: Path) -> Path:
    """The best trial's whole configuration as a recipe to train: its search settings and
    the reductions that made each trial cheaper (--reduce) left out, those named."""
    from hpctrain.config import load_config, to_yaml

    chosen = [override(key, value) for key, value in trial.params.items()]
    config = load_config(search.recipe, [*search.overrides, *chosen])
    tree = config.model_dump(mode="json")
    tree.update(name=f"{config.name}-tuned", run_name=None, resume=None)
    tree.pop("trial", None)
    reduced = (f"# its trials also ran with {' '.join(search.reductions)} (--reduce, to "
               "make each cheaper): left out here\n" if search.reductions else "")
    header = (f"# The best of the search in {folder}: trial {trial.number}, "
              f"{search.objective} = {trial.value:.6g}\n# with {' '.join(chosen)}\n"
              f"{reduced}# train it: hpctrain run {folder / BEST_RECIPE}\n")
    path = folder / BEST_RECIPE
    write_whole(path, header + to_yaml(type(config).model_validate(tree)))
    return path


def collect(folder: Path, write: bool = True) -> dict:
    """The search's state; with `write`, best.yaml, results.json and the pictures too."""
    from hpctrain.tune.pictures import history_picture, parallel_picture

    folder = Path(folder)
    search = read_search(folder)
    parameters = parse_all(search.space)
    study = open_study(folder, search, 0, parameters, create=False)
    rows = trial_rows(study, folder)
    best = best_trial(study)
    states = {}
    for row in rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    result = {"folder": str(folder), "recipe": search.recipe, "objective": search.objective,
              "direction": search.direction, "budget": search.trials, "states": states,
              "best": None if best is None else {
                  "trial": best.number, "value": best.value, "params": dict(best.params),
                  "overrides": [override(k, v) for k, v in best.params.items()]},
              "importances": importances(study), "trials": rows,
              "steps_trained": sum(row["steps"] or 0 for row in rows)}
    if write:
        outputs = {}
        if best is not None:
            outputs["best_recipe"] = str(write_best_recipe(search, best, folder))
        if history_picture(rows, search, folder / HISTORY_PICTURE):
            outputs["history"] = str(folder / HISTORY_PICTURE)
        if parallel_picture(rows, search, parameters, folder / PARALLEL_PICTURE):
            outputs["parallel_coordinates"] = str(folder / PARALLEL_PICTURE)
        result["outputs"] = outputs
        write_whole(folder / RESULTS, json.dumps(result, indent=1, default=str) + "\n")
    return result


def text(result: dict) -> str:
    """The search for people: a line per trial, the best, the importances, the files."""
    lines = [f"search {result['folder']}: {result['recipe'] or 'default'}, "
             f"{result['objective']} ({result['direction']}), budget {result['budget']} "
             "trials; " + ", ".join(f"{n} {s}" for s, n in sorted(result["states"].items()))]
    best = result["best"]
    for row in result["trials"]:
        value = "" if row["value"] is None else f"{row['value']:.4g}"
        mark = "  <- best" if best and row["trial"] == best["trial"] else ""
        retry = f" (retry of {row['retry_of']})" if row["retry_of"] is not None else ""
        lines.append(f"  {row['trial']:>4}  {row['state']:<8} {value:>9}  steps "
                     f"{row['steps'] if row['steps'] is not None else '-':>6}  "
                     + shown(row["params"]) + retry
                     + mark)
    if best:
        lines.append(f"best: trial {best['trial']}, {result['objective']} {best['value']:.4g} "
                     f"with {shown(best['params'])}")
    if result["importances"]:
        lines.append("importance: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                result["importances"].items()))
    for name, path in result.get("outputs", {}).items():
        lines.append(f"{name.replace('_', ' ')}: {path}")
    return "\n".join(lines)
