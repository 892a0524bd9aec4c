"""The command line's argument types and parsing rules, which every verb family uses: a
verb's parser (`make_verb`), numbers that must be whole and positive, sizes, lists of counts,
option values that start with a dash, a verb's own sub-commands beside its positionals, and a
usage mistake said in one line.
"""

from __future__ import annotations

import argparse
import sys

from hpctrain.errors import ConfigError, ExitCode, exit_code_table


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
    whole usage text, and a verb's own sub-commands beside its positionals (`tune status DIR`
    beside `tune RECIPE`), which argparse's sub-parsers cannot share with a positional."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sub_commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):
        self.exit(ExitCode.BAD_INPUT,
                  f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def add_sub_command(self, name: str, epilog: str, func) -> argparse.ArgumentParser:
        """`PROG NAME ...`: its own parser, chosen when NAME comes first, which runs `func`."""
        parser = Parser(prog=f"{self.prog} {name}",
                        epilog=f"{epilog.rstrip()}\n\n{exit_code_table()}",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.set_defaults(func=func)
        self.sub_commands[name] = parser
        return parser

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        chosen = self.sub_commands.get(args[0]) if args else None
        if chosen is not None:
            return chosen.parse_known_args(args[1:], namespace)
        return super().parse_known_args(args, namespace)


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


def duration(text: str) -> float:
    """An argparse type: seconds from '90', '90s', '10m' or '2h'."""
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:].lower(), None)
    try:
        return seconds(text[:-1] if scale else text) * (scale or 1)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give 90s, 10m or "
                                         "2h") from None


def rate(text: str) -> float:
    """An argparse type: bytes a second from '500', '64k' or '2M' (binary: k is 1,024)."""
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower())
    try:
        return seconds(text[:-1] if scale else text) * (scale or 1)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate: give bytes a second, e.g. "
                                         "500, 64k or 2M") from None


def _script_options() -> dict[str, object]:
    """Each scheduler's option that adds a line to its batch script -> the scheduler (the
    registry imported late: it reads the cluster profiles' schema)."""
    from hpctrain.cluster.scheduler import SCHEDULERS

    return {job.SCRIPT_OPTION: job for job in SCHEDULERS.values()}


def join_dashed_values(argv: list[str]) -> list[str]:
    """A batch-script option's value that starts with '-' (`OPTION --mail-type=END`) joined
    to it (`OPTION=--mail-type=END`): argparse would take the value for an option of its
    own."""
    dashed = _script_options()
    joined, rest = [], list(argv)
    while rest:
        item = rest.pop(0)
        if item in dashed and rest:
            item = f"{item}={rest.pop(0)}"
        joined.append(item)
    return joined


JSON_HELP = "print it as JSON, for machines (progress lines go to stderr)"


def add_recipe(parser: argparse.ArgumentParser, overrides_help: str | None = None,
               recipe_help: str | None = None) -> None:
    """The RECIPE [key=value ...] positionals every verb that loads a recipe takes."""
    parser.add_argument("recipe", nargs="?", default=None, help=recipe_help or
                        "a shipped recipe's name (hpctrain recipes) or a YAML file (default: "
                        "default)")
    parser.add_argument("overrides", nargs="*", help=overrides_help or
                        "key=value settings over the recipe (docs/reference/recipe.md)")


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """The batch job's options, shared by submit, tune --submit and scale --submit."""
    parser.add_argument("--time", default="1:00:00", help="time limit per job (requeued "
                        "until the work is done), Slurm format: 90, 2:00:00, 1-00:00:00")
    parser.add_argument("--cluster", help="profile name (default: $HPCTRAIN_CLUSTER or "
                        "generic)")
    parser.add_argument("--nodes", type=count(1), help="per job; default: as few as the "
                        "profile allows")
    for option in ("account", "partition", "qos", "constraint", "mem", "job-name"):
        parser.add_argument(f"--{option}", help=f"the job's {option} (the scheduler's "
                            f"--{option})")
    parser.add_argument("--cpus-per-gpu", type=count(1), help="CPU cores per GPU (default: "
                        "the profile's)")
    parser.add_argument("--module", action="append", default=[], help="repeatable")
    parser.add_argument("--venv", help="a virtual environment to activate")
    parser.add_argument("--conda", help="a conda environment to activate")
    parser.add_argument("--container", help="an Apptainer/Singularity image (.sif)")
    for option, job in _script_options().items():
        parser.add_argument(option, dest="script_options", action="append", default=[],
                            help=f"one more line of {job.NAME}'s batch script, e.g. "
                            f"'{job.SCRIPT_EXAMPLE}'")
    parser.add_argument("--max-requeues", type=count(0), default=20, help="jobs a run "
                        "continues in after its first, at most (time limits, preemptions)")


def job_options(args) -> dict:
    """The job options of `args`, as cluster.jobs takes them."""
    return dict(nodes=args.nodes, job_name=args.job_name, account=args.account,
                partition=args.partition, qos=args.qos, constraint=args.constraint,
                cpus_per_gpu=args.cpus_per_gpu, mem=args.mem, modules=args.module,
                venv=args.venv, conda=args.conda, container=args.container,
                script_options=args.script_options, max_requeues=args.max_requeues)


def make_verb(verbs, name: str, help: str | None, epilog: str, func) -> argparse.ArgumentParser:
    """A verb's parser: its help, its examples and the exit codes below the options, the
    function it runs."""
    listed = {"help": help} if help is not None else {}  # None: a verb of another's
    parser = verbs.add_parser(name, epilog=f"{epilog.rstrip()}\n\n{exit_code_table()}",
                              formatter_class=argparse.RawDescriptionHelpFormatter, **listed)
    parser.set_defaults(func=func)
    return parser
