"""What autotune leaves in its folder: the tuned recipe (`tuned.yaml`, which `hpctrain run`
trains), every trial with its figures or why it was not measured (`autotune.json`), and the
table it prints."""

from __future__ import annotations

import json
from hpctrain.autotune.search import Outcome, shown
from hpctrain.autotune.trials import Trial
from hpctrain.config import to_yaml
from hpctrain.runs.directory import TUNED_RECIPE
from hpctrain.units import fmt_bytes
from hpctrain.writers import write_whole

RESULTS = "autotune.json"


def write(outcome: Outcome) -> dict:
    """tuned.yaml and autotune.json; the document autotune.json holds."""
    document = summary(outcome)
    write_whole(outcome.folder / TUNED_RECIPE, _recipe(outcome))
    write_whole(outcome.folder / RESULTS, json.dumps(document, indent=1) + "\n")
    return document


def _recipe(outcome: Outcome) -> str:
    pick, config = outcome.pick, outcome.config
    tree = outcome.tuned.model_dump(mode="json")
    tree.update(name=f"{config.name}-tuned", run_name=None, resume=None)
    header = (f"# autotune's pick for {config.name} on this machine (trial {pick.number}): "
              f"{shown(pick.choices, outcome.space)}\n# {_speedup_line(outcome)}\n")
    if numerics := _numerics_changed(outcome):
        header += f"# changes the numerics: {', '.join(numerics)}\n"
    header += f"# train it: hpctrain run {outcome.folder / TUNED_RECIPE}\n"
    return header + to_yaml(type(outcome.tuned).model_validate(tree))


def _numerics_changed(outcome: Outcome) -> list[str]:
    pick = outcome.pick
    return [name for name, label in pick.choices.items()
            if (knob := outcome.space.knob(name)) and knob.numerics and label != knob.own.label]


def _speedup_line(outcome: Outcome) -> str:
    """The pick against the recipe: from the confirmation runs where both ran again, else
    from the trials."""
    base, pick = _compared(outcome)
    source = "in the longer runs" if base is not outcome.baseline else "in the trials"
    return (f"{pick.samples_per_second / base.samples_per_second:.2f}x the recipe's samples/s "
            f"{source} ({base.samples_per_second:,.1f} -> {pick.samples_per_second:,.1f}); the "
            f"run {base.predicted_run_seconds:.0f} s -> {pick.predicted_run_seconds:.0f} s "
            f"predicted ({outcome.total_steps} steps)")


def _compared(outcome: Outcome) -> tuple[Trial, Trial]:
    """(the recipe's figures, the pick's): the confirmation runs where both are measured."""
    again, confirmation = outcome.recipe_again, outcome.confirmation
    if again is not None and again.measured and confirmation is not None and \
            confirmation.measured:
        return again, confirmation
    if outcome.pick is outcome.baseline and confirmation is not None and confirmation.measured:
        return confirmation, confirmation
    return outcome.baseline, outcome.pick


def summary(outcome: Outcome) -> dict:
    pick, confirm = outcome.pick, outcome.confirmation
    deviation = None
    if confirm is not None and confirm.measured:
        deviation = pick.samples_per_second / confirm.samples_per_second - 1
    base, picked = _compared(outcome)
    return {
        "recipe": outcome.config.name, "folder": str(outcome.folder),
        "tuned_recipe": str(outcome.folder / TUNED_RECIPE),
        "budget_seconds": outcome.budget_seconds, "budget": outcome.budget_note,
        "spent_seconds": round(outcome.spent_seconds, 1), "total_steps": outcome.total_steps,
        "pick": pick.number, "pick_settings": pick.settings,
        "speedup": picked.samples_per_second / base.samples_per_second,
        "samples_per_second": {"recipe": base.samples_per_second,
                               "pick": picked.samples_per_second},
        "run_seconds_predicted": {"recipe": base.predicted_run_seconds,
                                  "pick": picked.predicted_run_seconds},
        "confirmation": confirm.to_json() if confirm else None,
        "recipe_again": outcome.recipe_again.to_json() if outcome.recipe_again else None,
        "trial_against_confirmation": deviation,
        "numerics_changed": _numerics_changed(outcome),
        "notes": outcome.notes, "trials": [t.to_json() for t in outcome.trials]}


def text(outcome: Outcome, document: dict) -> str:
    rows = [f"{'#':>3}  {'settings (against the recipe)':<44} {'samples/s':>10} {'ms/step':>8} "
            f"{'wait':>5} {'one-time':>8} {'run':>7} {'peak':>9}  outcome"]
    for trial in outcome.trials:
        rows.append(_row(trial, outcome))
    lines = [f"autotune {outcome.config.name}: {len(outcome.trials)} trials in "
             f"{outcome.spent_seconds:.0f} s of a {outcome.budget_seconds:.0f} s budget "
             f"({outcome.budget_note})", "", *rows, ""]
    lines.append(f"pick: trial {outcome.pick.number}, {shown(outcome.pick.choices, outcome.space)}")
    lines.append(f"  {_speedup_line(outcome)}")
    deviation = document["trial_against_confirmation"]
    if deviation is not None:
        confirm = outcome.confirmation
        lines.append(f"  run again for {confirm.steps} measured steps: "
                     f"{confirm.samples_per_second:,.1f} samples/s; its trial read "
                     f"{deviation:+.1%} from that")
    elif outcome.confirmation is not None:
        lines.append(f"  confirmation run: {outcome.confirmation.status}, "
                     f"{outcome.confirmation.why}")
    if document["numerics_changed"]:
        lines.append(f"  changes the numerics: {', '.join(document['numerics_changed'])}")
    lines += [f"  note: {note}" for note in outcome.notes]
    lines.append(f"tuned recipe: {document['tuned_recipe']} (hpctrain run it); every trial: "
                 f"{outcome.folder / RESULTS}")
    return "\n".join(lines)


def _row(trial: Trial, outcome: Outcome) -> str:
    settings = shown(trial.choices, outcome.space)
    if "confirms" in trial.extra:
        settings = f"trial {trial.extra['confirms']} again, longer"
    if "again" in trial.extra:
        settings = f"trial {trial.extra['again']} again (run-off)"
    if not trial.measured:
        return f"{trial.number:>3}  {settings:<44} {trial.status}: {trial.why}"
    peak = fmt_bytes(trial.peak_memory_bytes) if trial.peak_memory_bytes else "-"
    verdict = "pick" if trial is outcome.pick else ""
    if "runs" in trial.extra:
        verdict += f"{', ' if verdict else ''}median of {trial.extra['runs']}: " \
            f"{trial.extra['median_run_seconds']:.0f} s"
    if "pays_from_steps" in trial.extra:
        verdict = f"faster steps, pays from {trial.extra['pays_from_steps']:,} steps"
    return (f"{trial.number:>3}  {settings:<44} {trial.samples_per_second:>10,.1f} "
            f"{trial.step_seconds * 1000:>8.1f} {trial.data_wait:>5.0%} "
            f"{trial.one_time_seconds:>7.1f}s {trial.predicted_run_seconds:>6.0f}s {peak:>9}  "
            f"{verdict}")

