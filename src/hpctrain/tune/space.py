"""The search space: `--space 'optim.lr=loguniform(1e-3,1)'` specs, read into Optuna's
distributions, each checked against the recipe before anything runs.

    KEY=loguniform(LOW,HIGH)        a float, sampled on a log scale (0 < LOW < HIGH)
    KEY=uniform(LOW,HIGH[,STEP])    a float, on a linear scale; with STEP, on a grid
    KEY=int(LOW,HIGH[,STEP])        a whole number, LOW and HIGH included
    KEY=logint(LOW,HIGH)            a whole number on a log scale (1 <= LOW < HIGH)
    KEY=choice(A,B,...)             one of the values (read as YAML: 0.1, true, sgd)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from hpctrain.errors import ConfigError
from hpctrain.readers import LimitBroken, load_yaml, yaml_problem

SPEC = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=\s*([a-z]+)\s*\((.*)\)\s*$", re.S)
KINDS = ("loguniform", "uniform", "int", "logint", "choice")


@dataclass(frozen=True)
class Parameter:
    key: str  # a dotted configuration key: the trial's override is key=value
    kind: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple = ()
    spec: str = ""  # as the user wrote it

    def suggest(self, trial):
        """This parameter's value for `trial`, from the study's sampler (an enqueued retry's
        own value where it has one), through the distribution above."""
        from optuna.distributions import FloatDistribution, IntDistribution

        spread = self.distribution()
        if isinstance(spread, FloatDistribution):
            return trial.suggest_float(self.key, spread.low, spread.high, step=spread.step,
                                       log=spread.log)
        if isinstance(spread, IntDistribution):
            return trial.suggest_int(self.key, spread.low, spread.high, step=spread.step,
                                     log=spread.log)
        return trial.suggest_categorical(self.key, spread.choices)

    def distribution(self):
        """The Optuna distribution this parameter is sampled from."""
        from optuna.distributions import (CategoricalDistribution, FloatDistribution,
                                          IntDistribution)

        if self.kind == "choice":
            return CategoricalDistribution(self.choices)
        log = self.kind in ("loguniform", "logint")
        if self.kind in ("int", "logint"):
            return IntDistribution(int(self.low), int(self.high), log=log,
                                   step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=log, step=self.step)

    def grid(self) -> list | None:
        """Every value, for the grid sampler; None for a continuous range."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int" or (self.kind == "uniform" and self.step):
            count = int(round((self.high - self.low) / (self.step or 1))) + 1
            values = [self.low + i * (self.step or 1) for i in range(count)]
            return [int(v) for v in values] if self.kind == "int" else \
                [round(v, 12) for v in values]
        return None

    def samples(self) -> list:
        """Values that stand for the range when the recipe checks it: both ends, or each
        choice."""
        if self.kind == "choice":
            return list(self.choices)
        cast = int if self.kind in ("int", "logint") else float
        return [cast(self.low), cast(self.high)]


def override(key: str, value) -> str:
    """key=value as the command line reads it back (a string stays the same string)."""
    if isinstance(value, bool) or value is None:
        return f"{key}={yaml.safe_dump(value).split(chr(10))[0]}"
    return f"{key}={value}"


def shown(params: dict) -> str:
    """Parameters for people: floats to 4 significant digits (the trials get them whole)."""
    return " ".join(override(k, f"{v:.4g}" if isinstance(v, float) else v)
                    for k, v in params.items())


def parse(spec: str) -> Parameter:
    """One --space spec; a ConfigError naming it (and how to write it) when it is not one."""
    match = SPEC.match(spec)
    if not match:
        raise ConfigError(f"--space {spec!r}: write KEY=KIND(ARGS), e.g. "
                          "'optim.lr=loguniform(1e-3,1)' or 'optim.name=choice(sgd,lamb)' "
                          f"(kinds: {', '.join(KINDS)})")
    key, kind, body = match.groups()
    if kind not in KINDS:
        raise ConfigError(f"--space {key}: unknown kind {kind!r}; use one of "
                          f"{', '.join(KINDS)}")
    args = [a.strip() for a in body.split(",")] if body.strip() else []
    if kind == "choice":
        if len(args) < 2 or any(not a for a in args):
            raise ConfigError(f"--space {key}: choice needs two or more values, e.g. "
                              "choice(sgd,lamb)")
        choices = tuple(_scalar(key, a) for a in args)
        if len(set(map(repr, choices))) < len(choices):
            raise ConfigError(f"--space {key}: a value is given twice in {spec!r}")
        return Parameter(key, kind, choices=choices, spec=spec)
    return _range(key, kind, args, spec)


def _scalar(key: str, text: str):
    try:
        value = load_yaml(text)
    except LimitBroken as err:
        raise ConfigError(f"--space {key}: {yaml_problem(err)}") from None
    except yaml.YAMLError:
        value = text
    if not isinstance(value, (str, int, float, bool)):
        raise ConfigError(f"--space {key}: {text!r} is not a single value")
    return value


def _range(key: str, kind: str, args: list[str], spec: str) -> Parameter:
    steps_allowed = kind in ("uniform", "int")
    if len(args) not in ((2, 3) if steps_allowed else (2,)):
        form = f"{kind}(LOW,HIGH[,STEP])" if steps_allowed else f"{kind}(LOW,HIGH)"
        raise ConfigError(f"--space {key}: write {form}, not {spec.split('=', 1)[1].strip()}")
    try:
        numbers = [float(a) for a in args]
    except ValueError:
        raise ConfigError(f"--space {key}: {kind} takes numbers, not {', '.join(args)}") \
            from None
    low, high = numbers[:2]
    step = numbers[2] if len(numbers) == 3 else None
    if kind in ("int", "logint") and any(n != int(n) for n in numbers):
        raise ConfigError(f"--space {key}: {kind} takes whole numbers, not {', '.join(args)}")
    if not low < high:
        raise ConfigError(f"--space {key}: LOW must be below HIGH (got {args[0]}, {args[1]})")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"--space {key}: loguniform needs 0 < LOW (got {args[0]}); use "
                          "uniform for a range that includes 0")
    if kind == "logint" and low < 1:
        raise ConfigError(f"--space {key}: logint needs LOW >= 1 (got {args[0]})")
    if step is not None and (step <= 0 or step > high - low):
        raise ConfigError(f"--space {key}: STEP must be above 0 and at most HIGH - LOW "
                          f"(got {args[2]})")
    if step is not None and abs(round((high - low) / step) * step - (high - low)) > 1e-9 * step:
        raise ConfigError(f"--space {key}: HIGH - LOW ({high - low:g}) is not a whole number "
                          f"of steps of {step:g}")
    return Parameter(key, kind, low, high, step, spec=spec)


def parse_all(specs: list[str]) -> list[Parameter]:
    """Every --space spec, each key once."""
    if not specs:
        raise ConfigError("give the search space: --space KEY=KIND(ARGS), repeatable, e.g. "
                          "--space 'optim.lr=loguniform(1e-3,1)'")
    parameters = [parse(spec) for spec in specs]
    seen = set()
    for parameter in parameters:
        if parameter.key in seen:
            raise ConfigError(f"--space {parameter.key}: given twice; give each key once")
        seen.add(parameter.key)
    return parameters


def check_against(parameters: list[Parameter], load) -> None:
    """Each parameter's values make a valid configuration (`load(overrides)` raises
    ConfigError otherwise): a key that does not exist, or a range the recipe refuses, is an
    error naming the parameter now, not a failed trial later."""
    for parameter in parameters:
        for value in parameter.samples():
            try:
                load([override(parameter.key, value)])
            except ConfigError as err:
                raise ConfigError(f"--space {parameter.key}: {override(parameter.key, value)} "
                                  f"is refused by the recipe: {err}") from None
