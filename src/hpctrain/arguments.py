"""The command line's argument types and parsing rules, beside cli.py: numbers that must be
whole and positive, sizes, lists of counts, option values that start with a dash, and a usage
mistake said in one line.
"""

from __future__ import annotations

import argparse

from hpctrain.errors import ConfigError, ExitCode


def counts(text: str | None, option: str) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4] (positive whole numbers); None stays None."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ConfigError(f"{option} {text!r}: use positive whole numbers separated by "
                          "commas, such as 1,2,4")
    return values


def size_bytes(text: str, option: str) -> int:
    """'256MB', '1GB', '500k' or a plain number of bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = number[-1:] if number[-1:] in units else ""
    digits = number[:len(number) - len(unit)]
    if not digits.isdigit() or int(digits) == 0:
        raise ConfigError(f"{option} {text!r}: use a size such as 256MB or 1GB")
    return int(digits) * units[unit]


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake said in one line (and where to look) instead of the
    whole usage text."""

    def error(self, message: str):
        self.exit(ExitCode.BAD_INPUT,
                  f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def count(least: int):
    """An argparse type: a whole number of at least `least`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least "
                                             f"{least}")
        return value
    return parse


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


DASHED_VALUES = ("--extra-sbatch",)  # options whose value itself starts with '-'


def join_dashed_values(argv: list[str]) -> list[str]:
    """`--extra-sbatch --mail-type=END` as `--extra-sbatch=--mail-type=END`: argparse would
    take the value for an option of its own."""
    joined, rest = [], list(argv)
    while rest:
        item = rest.pop(0)
        if item in DASHED_VALUES and rest:
            item = f"{item}={rest.pop(0)}"
        joined.append(item)
    return joined


def add_recipe(parser: argparse.ArgumentParser, overrides_help: str | None = None,
               recipe_help: str | None = None) -> None:
    """The RECIPE [key=value ...] positionals every verb that loads a recipe takes."""
    parser.add_argument("recipe", nargs="?", default=None, help=recipe_help)
    parser.add_argument("overrides", nargs="*", help=overrides_help)


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """The Slurm job's options, shared by submit, tune --submit and scale --submit."""
    parser.add_argument("--time", default="1:00:00", help="time limit per job (requeued "
                        "until the work is done), Slurm format: 90, 2:00:00, 1-00:00:00")
    parser.add_argument("--cluster", help="profile name (default: $HPCTRAIN_CLUSTER or "
                        "generic)")
    parser.add_argument("--nodes", type=count(1), help="per job; default: as few as the "
                        "profile allows")
    for option in ("account", "partition", "qos", "constraint", "mem", "job-name"):
        parser.add_argument(f"--{option}")
    parser.add_argument("--cpus-per-gpu", type=count(1))
    parser.add_argument("--module", action="append", default=[], help="repeatable")
    parser.add_argument("--venv", help="a virtual environment to activate")
    parser.add_argument("--conda", help="a conda environment to activate")
    parser.add_argument("--container", help="an Apptainer/Singularity image (.sif)")
    parser.add_argument("--extra-sbatch", action="append", default=[],
                        help="one more #SBATCH directive, e.g. '--mail-type=END'")
    parser.add_argument("--max-requeues", type=count(0), default=20)


def job_options(args) -> dict:
    """The job options of `args`, as cluster.jobs takes them."""
    return dict(nodes=args.nodes, job_name=args.job_name, account=args.account,
                partition=args.partition, qos=args.qos, constraint=args.constraint,
                cpus_per_gpu=args.cpus_per_gpu, mem=args.mem, modules=args.module,
                venv=args.venv, conda=args.conda, container=args.container,
                extra_sbatch=args.extra_sbatch, max_requeues=args.max_requeues)
