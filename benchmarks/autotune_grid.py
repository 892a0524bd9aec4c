"""hpctrain autotune against the exhaustive grid over the same candidates.

The grid measures every combination of the knobs' choices (each a trial as autotune runs it:
an `hpctrain run` process, the same warm-up and measured steps) and ranks them as autotune
does, by the run's predicted time with its one-time costs. autotune runs as a user runs it
(`hpctrain autotune RECIPE --json`, its own budget). Then three settings are measured again
in longer runs, alternating, `--rounds` times: the recipe as given, autotune's pick and the
grid's best; the table gives each one's median samples/s and its ratio to the grid's best.

    python benchmarks/autotune_grid.py default --fix compile
    python benchmarks/autotune_grid.py tiny-lm --fix compile --rounds 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.autotune.knobs import settings_of, space_of
from hpctrain.autotune.search import fixed_settings, shown
from hpctrain.autotune.trials import Plan, Trial, run_steps, run_trial
from hpctrain.config import load_config

GRID_BEST = "the grid's best"


def grid(recipe: str, overrides: list[str], fixed: list[str], plan: Plan, measure: int,
         limit: float) -> tuple[list[Trial], float, int]:
    """Every combination, measured; (trials, seconds, the run's steps)."""
    settings, kept = fixed_settings(lambda extra: load_config(recipe, [*overrides, *extra]),
                                    fixed)
    config = load_config(recipe, [*overrides, *settings])
    space = space_of(config, kept)
    started, trials = time.perf_counter(), []
    for number, combination in enumerate(itertools.product(*(k.choices for k in space.knobs))):
        trial = Trial(number, {c.knob: c.label for c in combination}, settings_of(combination))
        run_trial(plan, trial, measure, limit)
        print(f"grid {number}: {shown(trial.choices, space)}: "
              f"{trial.samples_per_second or trial.status}", file=sys.stderr, flush=True)
        trials.append(trial)
    steps = run_steps(config, trials[0])
    for trial in trials:
        if trial.measured:
            trial.predicted_run_seconds = trial.one_time_seconds + steps * trial.step_seconds
    return trials, time.perf_counter() - started, steps


def autotune(recipe: str, overrides: list[str], fixed: list[str], folder: Path,
             options: list[str]) -> dict:
    command = [sys.executable, "-m", "hpctrain", "autotune", recipe, *overrides,
               *(arg for key in fixed for arg in ("--fix", key)), "--dir", str(folder),
               "--json", *options]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"hpctrain autotune failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def alternate(plan: Plan, rows: list[tuple[str, list[str]]], measure: int, rounds: int,
              limit: float) -> dict[str, list[float]]:
    """Each row's samples/s in `rounds` longer runs, the rows alternating."""
    figures: dict[str, list[float]] = {name: [] for name, _ in rows}
    number = 1000
    for _ in range(rounds):
        for name, settings in rows:
            trial = run_trial(plan, Trial(number, {}, settings), measure, limit)
            number += 1
            if trial.measured:
                figures[name].append(trial.samples_per_second)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--fix", action="append", default=[], help="as autotune's --fix")
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--measure-steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trial-seconds", type=float, default=300)
    parser.add_argument("--budget", help="autotune's --budget (default: its own)")
    parser.add_argument("--dir", help="where the trials go (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="autotune-grid-"))
    plan = Plan(args.recipe, args.overrides, root / "grid", warmup=args.warmup_steps,
                log_every=max(d for d in range(1, 6) if args.warmup_steps % d == 0))
    trials, grid_seconds, steps = grid(args.recipe, args.overrides, args.fix, plan,
                                       args.measure_steps, args.trial_seconds)
    measured = [t for t in trials if t.measured]
    best = min(measured, key=lambda t: t.predicted_run_seconds)
    tuned = autotune(args.recipe, args.overrides, args.fix, root / "autotune",
                     ["--warmup-steps", str(args.warmup_steps), "--measure-steps",
                      str(args.measure_steps), *(["--budget", args.budget] if args.budget
                                                 else [])])
    rows = [("the recipe as given", []), ("autotune's pick", tuned["pick_settings"]),
            (GRID_BEST, best.settings)]
    figures = alternate(Plan(args.recipe, args.overrides, root / "confirm",
                             warmup=args.warmup_steps, log_every=plan.log_every),
                        rows, 3 * args.measure_steps, args.rounds, args.trial_seconds)
    report(args, trials, grid_seconds, steps, best, tuned, rows, figures)


def report(args, trials, grid_seconds, steps, best, tuned, rows, figures) -> None:
    medians = {name: statistics.median(values) if values else float("nan")
               for name, values in figures.items()}
    print(f"{args.recipe} {' '.join(args.overrides)}: {len(trials)} candidates "
          f"({sum(t.measured for t in trials)} measured), fixed: {', '.join(args.fix) or '-'}; "
          f"the run {steps} steps")
    print(f"exhaustive grid: {grid_seconds:.0f} s; autotune: {len(tuned['trials'])} trials in "
          f"{tuned['spent_seconds']:.0f} s (budget {tuned['budget_seconds']:.0f} s)")
    print(f"{'settings':<22}{'samples/s':>12}{'to grid best':>14}  what")
    for name, settings in rows:
        print(f"{name:<22}{medians[name]:>12,.1f}"
              f"{medians[name] / medians[GRID_BEST]:>14.3f}  "
              f"{' '.join(settings) or '-'}")
    deviation = tuned["trial_against_confirmation"]
    if deviation is not None:
        print(f"autotune's trial figure read {deviation:+.1%} from its own confirmation run")
    print(f"samples/s: median of {args.rounds} alternating runs of {3 * args.measure_steps} "
          f"measured steps; the grid's best by predicted run time "
          f"({best.predicted_run_seconds:.0f} s)")


if __name__ == "__main__":
    main()
