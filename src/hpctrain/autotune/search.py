"""Which candidates to measure, within the budget, and which one the run should take.

The recipe as given is measured first (the baseline: it also says how long the run is, and so
the default budget: 10 % of the run, at least MIN_BUDGET, which is what a handful of trials
costs, and at most MAX_BUDGET). Then one knob at a time, from the best so far: each choice
of the knob with every other knob as the best has it; the best moves only for a gain past
MIN_GAIN (trials are noisy). A knob whose choices lie on a line (micro-batch, workers) is
walked from the current choice while each step gains. A second pass tries the knobs again
from a best that changed (bf16 may make channels_last pay, a faster step may need more
workers); a micro-batch the prediction says does not fit is tried with activation
checkpointing; a choice that failed or hung is not tried again. Candidates are compared by
the run's predicted time, one-time costs (start-up, compilation) included: a faster step that
does not pay for its compilation within the run's steps loses, and says from how many steps
it would pay. Compilation is searched last: its trials cost the most. Then the near misses
(one-knob changes that came within NEAR of the best) are tried together, and what the budget
leaves goes to a run-off: the closest candidates measured again in turn, judged by their
median (a shared machine's pace moves by tens of percent between processes). Last, the
recipe as given and the pick run again, longer, one after the other: the pick stands only if
it is still the faster, and the speed-up reported is theirs.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hpctrain.autotune.fit import predict_fit
from hpctrain.autotune.knobs import (Choice, Knob, Space, settings_of, space_of,
                                     with_checkpointing)
from hpctrain.autotune.trials import Plan, Trial, next_number, run_steps, run_trial
from hpctrain.config import Config, load_config
from hpctrain.errors import ConfigError, RunFailed, UserError
from hpctrain.runs.directory import COMPILE_CACHE

MIN_BUDGET = 120.0  # seconds: the baseline, a handful of candidates and the confirmations
MAX_BUDGET = 900.0
BUDGET_SHARE = 0.10  # of the run it tunes
MIN_GAIN = 0.02  # a candidate beats the best only by more than this share of the run's time
MEASURE_SECONDS = 3.0  # each trial's measured steps last about this long, at the baseline's pace
CONFIRM_FACTOR = 3  # the confirmation runs measure this many times a trial's steps
CONFIRMATIONS = 2  # the recipe as given and the pick, run again: the budget keeps room for them
NEAR = 0.05  # a one-knob change within this share of the best's time is a near miss
RUNOFF = 3  # the closest candidates measured again with the budget left
RUNOFF_ROUNDS = 3
PASSES = 2
BROKEN = ("failed", "timed out", "invalid")  # a choice that ended so is not tried again
DATA_WAIT_FIRST = 0.1  # a share of the step's time: the data knobs are searched first


@dataclass
class Options:
    budget_seconds: float | None = None  # None: 10 % of the run, within the bounds above
    fixed: list[str] = field(default_factory=list)  # KEY (as the recipe has it) or KEY=VALUE
    warmup: int = 10
    measure: int | None = None  # measured steps per trial; None: about MEASURE_SECONDS
    trial_seconds: float | None = None  # the most a trial may take; None: 3x the baseline's
    confirm: bool = True
    processes: int = 1  # each trial's, one per device: the run's own layout


@dataclass
class Outcome:
    folder: Path
    config: Config
    space: Space
    trials: list[Trial]
    baseline: Trial
    pick: Trial
    total_steps: int
    budget_seconds: float
    budget_note: str
    spent_seconds: float
    tuned: Config  # the recipe with the pick's settings
    confirmation: Trial | None = None  # the pick run again, longer
    recipe_again: Trial | None = None  # the recipe as given run again, beside it
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C ended the search


def fixed_settings(config_of: Callable[[list[str]], Config], fixed: list[str]) \
        -> tuple[list[str], dict[str, str]]:
    """(the KEY=VALUE settings among --fix, every fixed key with its value as it stands)."""
    settings = [text for text in fixed if "=" in text]
    config = config_of(settings)
    kept = {}
    for text in fixed:
        key = text.split("=", 1)[0].strip()
        value = config.model_dump(mode="json")
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ConfigError(f"--fix {text}: {key} is no setting of the recipe")
            value = value[part]
        kept[key] = str(value)
    return settings, kept


class Search:
    def __init__(self, recipe: str | None, overrides: list[str], options: Options,
                 folder: Path, say: Callable[[str], None]):
        self.recipe, self.options, self.say = recipe, options, say
        self.processes = processes = options.processes
        settings, fixed = fixed_settings(lambda extra: load_config(recipe, [*overrides, *extra]),
                                         options.fixed)
        self.overrides = [*overrides, *settings]
        self.config = load_config(recipe, self.overrides)
        if self.config.compile_cache in ("shared", "run"):  # one for the trials and the pick
            self.overrides.append(f"compile_cache={folder.resolve() / COMPILE_CACHE}")
        self.space = space_of(self.config, fixed, processes)
        self.plan = Plan(recipe, self.overrides, folder, warmup=options.warmup,
                         log_every=max(d for d in range(1, 6) if options.warmup % d == 0),
                         launcher=launcher(processes))
        self.trials: list[Trial] = []
        self.first = next_number(folder)  # an earlier search's trials stay as they are
        self.chosen: dict[int, dict[str, Choice]] = {}  # trial number -> its choices
        self.tried: set[frozenset] = set()
        self.broken: set[Choice] = set()  # choices that failed or hung: not tried again
        self.started = time.perf_counter()
        self.budget = MAX_BUDGET
        self.limit = options.trial_seconds or MAX_BUDGET
        self.total_steps = 0
        self.measure = _whole_intervals(options.measure or 20, self.plan.log_every)

    # ---- the search, top to bottom ----
    def run(self) -> Outcome:
        baseline = self._baseline()
        note = self._set_budget(baseline)
        best, notes, interrupted = baseline, list(self.space.notes), False
        try:
            best = self._runoff(self._combine(self._passes(baseline)))
        except KeyboardInterrupt:
            interrupted = True
            best = min((t for t in self.trials if t.measured),
                       key=lambda t: t.predicted_run_seconds)
            notes.append(f"interrupted (Ctrl-C) after {len(self.trials)} trials: the pick is "
                         "the best measured so far, not confirmed")
        confirmation = recipe_again = None
        if self.options.confirm and not interrupted:
            best, confirmation, recipe_again = self._confirm(best, baseline, notes)
        tuned = load_config(self.recipe, [*self.overrides, *best.settings])
        return Outcome(self.plan.folder, self.config, self.space, self.trials, baseline, best,
                       self.total_steps, self.budget, note, self._spent(), tuned, confirmation,
                       recipe_again, notes, interrupted)

    def _passes(self, baseline: Trial) -> Trial:
        best = baseline
        for number in range(PASSES):
            before = best
            for knob in self._order(baseline):
                best = self._tune_knob(knob, best)
            if best is before or self._left() <= 0:
                break
            self.say(f"pass {number + 2}: the knobs again, from {self._shown(best)}")
        return best

    def _combine(self, best: Trial) -> Trial:
        """The near misses together: each one-knob change from the best whose trial came
        within NEAR of it, all at once (two small gains, each lost in the noise, may be one
        real gain)."""
        mine, changes = self.chosen[best.number], {}
        for trial in self._searched():
            theirs = self.chosen[trial.number]
            differing = [name for name in mine if theirs[name] != mine[name]]
            if len(differing) == 1 and trial is not best and \
                    trial.predicted_run_seconds <= best.predicted_run_seconds * (1 + NEAR):
                name = differing[0]
                if name not in changes or trial.predicted_run_seconds < changes[name][1]:
                    changes[name] = (theirs[name], trial.predicted_run_seconds)
        choices = {**mine, **{name: choice for name, (choice, _) in changes.items()}}
        if len(changes) < 2 or frozenset(choices.values()) in self.tried:
            return best
        self.tried.add(frozenset(choices.values()))
        self.say(f"the near misses together: {', '.join(sorted(changes))}")
        trial = self._candidate(choices)
        return trial if trial is not None and trial.measured and \
            trial.predicted_run_seconds < best.predicted_run_seconds else best

    def _runoff(self, best: Trial) -> Trial:
        """With what the budget leaves beside the confirmations, the RUNOFF closest
        candidates measured again, in turn, up to RUNOFF_ROUNDS times, and judged by their
        median; the best changes only for a gain past MIN_GAIN."""
        ranked = sorted(self._searched(), key=lambda t: t.predicted_run_seconds)[:RUNOFF]
        if best not in ranked:
            ranked[-1:] = [best]
        runs = {trial.number: [trial] for trial in ranked}
        for _ in range(RUNOFF_ROUNDS if len(ranked) > 1 else 0):
            if self._left() < len(ranked) * self._cost(self.measure) + self._reserve():
                break
            self.say(f"run-off: trials {', '.join(str(t.number) for t in ranked)} again")
            for trial in ranked:
                again = self._repeat(trial, "again")
                self._measure(self.chosen[trial.number], self.measure, self.limit, again)
                if again.measured:
                    runs[trial.number].append(again)
        if all(len(found) == 1 for found in runs.values()):
            return best
        for trial in ranked:
            trial.extra["median_run_seconds"] = statistics.median(
                t.predicted_run_seconds for t in runs[trial.number])
            trial.extra["runs"] = len(runs[trial.number])
        winner = min(ranked, key=lambda t: t.extra["median_run_seconds"])
        gained = winner.extra["median_run_seconds"] < \
            best.extra["median_run_seconds"] * (1 - MIN_GAIN)
        return winner if gained else best

    def _searched(self) -> list[Trial]:
        """The candidates measured by the search (not run again)."""
        return [t for t in self.trials if t.measured and "again" not in t.extra
                and "confirms" not in t.extra]

    def _baseline(self) -> Trial:
        own = {knob.name: knob.own for knob in self.space.knobs}
        self.tried.add(frozenset(own.values()))
        self.say(f"the recipe as given first ({self.options.warmup} warm-up steps, "
                 f"{self.measure} measured)")
        trial = self._measure(own, self.measure, self.limit)
        if not trial.measured:
            raise RunFailed(f"autotune: the recipe as given does not train ({trial.status}: "
                            f"{trial.why}); see {trial.log}")
        if not self.options.measure:
            self.measure = _whole_intervals(math.ceil(MEASURE_SECONDS / trial.step_seconds),
                                            self.plan.log_every, least=10)
        self.limit = self.options.trial_seconds or max(60.0, 3 * trial.wall_seconds)
        return trial

    def _set_budget(self, baseline: Trial) -> str:
        if self.options.budget_seconds is not None:
            self.budget = self.options.budget_seconds
            return "given (--budget)"
        share = BUDGET_SHARE * baseline.predicted_run_seconds
        self.budget = min(MAX_BUDGET, max(MIN_BUDGET, share))
        if share < MIN_BUDGET:
            return (f"the least a search needs; 10 % of the run's predicted "
                    f"{baseline.predicted_run_seconds:.0f} s would be {share:.0f} s")
        return f"10 % of the run's predicted {baseline.predicted_run_seconds:.0f} s" + \
            (f", at most {MAX_BUDGET:.0f} s" if share > MAX_BUDGET else "")

    def _order(self, baseline: Trial) -> list[Knob]:
        """Compilation last (its trials cost the most), the data knobs first where the
        recipe's steps wait for data."""
        data_first = (baseline.data_wait or 0) > DATA_WAIT_FIRST
        return sorted(self.space.knobs, key=lambda k: 2 if k.name == "compile" else
                      0 if data_first and k.name in ("workers", "decode") else 1)

    # ---- one knob, one candidate ----
    def _tune_knob(self, knob: Knob, best: Trial) -> Trial:
        """Each choice of `knob` from `best`; an ordered knob walked while each step gains."""
        current = self.chosen[best.number][knob.name]
        for choice in knob.choices:
            if choice != current and (choice.position is None or current.position is None):
                best = self._challenge(best, knob, choice)
        current = self.chosen[best.number][knob.name]
        if current.position is None:
            return best
        line = sorted((c for c in knob.choices if c.position is not None),
                      key=lambda c: c.position)
        start, moved = line.index(current), best
        for step in (1, -1):
            at = start + step
            while 0 <= at < len(line) and self._left() > 0:
                before = best
                best = self._challenge(best, knob, line[at])
                if best is before:
                    break
                at += step
            if best is not moved:  # it gained one way: the other way is the way it came
                break
        return best

    def _challenge(self, best: Trial, knob: Knob, choice: Choice) -> Trial:
        choices = {**self.chosen[best.number], knob.name: choice}
        key = frozenset(choices.values())
        if key in self.tried or choice in self.broken:
            return best
        self.tried.add(key)
        trial = self._candidate(choices)
        if trial is None:
            return best
        if trial.status in BROKEN:
            self.broken.add(choice)
        if trial.status == "pruned" and knob.name == "micro-batch" and not \
                self.config.model.activation_checkpointing and \
                "activation checkpointing" not in choice.label:
            return self._challenge(best, knob, with_checkpointing(choice))
        if trial.measured and trial.predicted_run_seconds < \
                best.predicted_run_seconds * (1 - MIN_GAIN):
            self.say(f"  best so far: trial {trial.number}")
            return trial
        if trial.measured and trial.step_seconds < best.step_seconds and \
                trial.one_time_seconds > best.one_time_seconds:
            trial.extra["pays_from_steps"] = math.ceil(
                (trial.one_time_seconds - best.one_time_seconds) /
                (best.step_seconds - trial.step_seconds))
        return best

    def _candidate(self, choices: dict[str, Choice]) -> Trial | None:
        """Measure `choices` unless the configuration refuses them, the prediction says
        they do not fit, or the budget cannot pay for them (None: not tried)."""
        trial = Trial(self._number(), _labels(choices), settings_of(choices.values()))
        try:
            config = load_config(self.recipe, [*self.overrides, *trial.settings])
        except UserError as err:
            return self._record(trial, choices, "invalid", str(err).splitlines()[0])
        prediction = predict_fit(config, self.processes)
        if prediction.misfit is not None:
            return self._record(trial, choices, "pruned", f"does not fit: {prediction.misfit}")
        if prediction.untold is not None:  # run it: the trial says
            trial.extra["memory_prediction"] = f"none ({prediction.untold})"
            self.say(f"  no memory prediction for it ({prediction.untold}): measured instead")
        room = self._left() - self._reserve()
        if room < self._cost(self.measure):
            self.say(f"  not tried, the budget is spent: {self._shown(trial)}")
            return None
        return self._measure(choices, self.measure, min(self.limit, room), trial)

    def _measure(self, choices: dict[str, Choice], measure: int, limit: float,
                 trial: Trial | None = None) -> Trial:
        trial = trial or Trial(self._number(), _labels(choices),
                               settings_of(choices.values()))
        self.say(f"trial {trial.number}: {self._shown(trial)}")
        run_trial(self.plan, trial, measure, limit)
        if not self.total_steps and trial.measured:  # the baseline says how long the run is
            self.total_steps = run_steps(self.config, trial)
        self._predict(trial)
        self._record(trial, choices)
        self.say(f"  {_result(trial)}")
        return trial

    def _record(self, trial: Trial, choices: dict[str, Choice], status: str | None = None,
                why: str = "") -> Trial:
        if status is not None:
            trial.status, trial.why = status, why
            self.say(f"trial {trial.number}: {self._shown(trial)}: {status}, {why}")
        self.trials.append(trial)
        self.chosen[trial.number] = choices
        return trial

    def _confirm(self, pick: Trial, baseline: Trial, notes: list[str]) \
            -> tuple[Trial, Trial, Trial | None]:
        """(the pick, its confirmation, the recipe's): the recipe as given and the pick run
        again, one after the other, longer; the pick stands only if it is still faster."""
        recipe_again = None if pick is baseline else self._again(baseline)
        confirmation = self._again(pick)
        if recipe_again is not None and recipe_again.measured and not (
                confirmation.measured and confirmation.predicted_run_seconds <
                recipe_again.predicted_run_seconds):
            notes.append(f"trial {pick.number} was no faster than the recipe as given when both "
                         f"ran again ({_pace(confirmation)} against {_pace(recipe_again)}): "
                         "the recipe as given is kept")
            return baseline, recipe_again, None
        return pick, confirmation, recipe_again

    def _again(self, trial: Trial) -> Trial:
        measure = CONFIRM_FACTOR * self.measure
        self.say(f"confirmation: trial {trial.number} again, {measure} measured steps")
        again = self._repeat(trial, "confirms")
        slack = 3 * (self._cost(measure) + trial.one_time_seconds)  # a hang's guard, not a cap
        return self._measure(self.chosen[trial.number], measure, max(self._left(), slack), again)

    def _repeat(self, trial: Trial, why: str) -> Trial:
        """A new trial of `trial`'s settings, marked with `why` (again: the run-off;
        confirms: a longer run) and the number it repeats."""
        repeat = Trial(self._number(), dict(trial.choices), list(trial.settings))
        repeat.extra[why] = trial.number
        return repeat

    def _number(self) -> int:
        """The next trial's number: after those of an earlier search in the folder."""
        return self.first + len(self.trials)

    # ---- figures ----
    def _predict(self, trial: Trial) -> None:
        if trial.measured:
            trial.predicted_run_seconds = trial.one_time_seconds + \
                self.total_steps * trial.step_seconds

    def _cost(self, measure: int) -> float:
        """What a trial of `measure` steps costs, as the baseline's did."""
        base = self.trials[0]
        overhead = base.wall_seconds - (self.plan.warmup + base.steps) * base.step_seconds
        return overhead + (self.plan.warmup + measure) * base.step_seconds

    def _reserve(self) -> float:
        """What the confirmation runs will cost: the search leaves it."""
        confirming = CONFIRMATIONS if self.options.confirm else 0
        return confirming * self._cost(CONFIRM_FACTOR * self.measure)

    def _spent(self) -> float:
        return time.perf_counter() - self.started

    def _left(self) -> float:
        return self.budget - self._spent()

    def _shown(self, trial: Trial) -> str:
        return shown(trial.choices, self.space)


def launcher(processes: int) -> tuple[str, ...]:
    """What starts a trial's processes: inside a scheduler's job, its launcher (the
    job's tasks, on the nodes that will train); here, torchrun for several."""
    from hpctrain.cluster.scheduler import current, in_job
    from hpctrain.tune.worker import torchrun

    return tuple(current().LAUNCHER) if in_job() else tuple(torchrun(processes))


def shown(choices: dict[str, str], space: Space) -> str:
    """The choices that differ from the recipe's, or 'the recipe as given'."""
    changed = [f"{name} {label}" for name, label in choices.items()
               if (knob := space.knob(name)) is not None and label != knob.own.label]
    return ", ".join(changed) or "the recipe as given"


def _labels(choices: dict[str, Choice]) -> dict[str, str]:
    return {name: choice.label for name, choice in choices.items()}


def _pace(trial: Trial) -> str:
    return f"{trial.samples_per_second:,.1f} samples/s" if trial.measured else trial.status


def _result(trial: Trial) -> str:
    if not trial.measured:
        return f"{trial.status}: {trial.why}"
    return (f"{trial.samples_per_second:,.1f} samples/s, {trial.step_seconds * 1000:.1f} ms a "
            f"step, data wait {trial.data_wait:.0%}, one-time {trial.one_time_seconds:.1f} s, "
            f"the run {trial.predicted_run_seconds:.0f} s")


def _whole_intervals(steps: int, log_every: int, least: int = 1) -> int:
    """`steps` rounded up to whole logging intervals, `least` to 200."""
    return max(least, min(200, math.ceil(steps / log_every) * log_every))
