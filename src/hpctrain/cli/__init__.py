"""The command line, by verb family: run (run, config show, prefetch, recipes), jobs
(submit, jobs, logs, cancel, status), runs (the runs index, top), views (one run read back:
report, watch, goodput), tune (tune, scale), bench (data, node, solve) and the tools (pack,
profile, memory); each family's module holds one `_add_VERB` (its arguments) beside each
`cmd_VERB` (its handler), parsing and printing only. Here: the parser of them all, and `main`.

Exit codes: errors.ExitCode, shown below every verb's --help. A user mistake prints a message
naming what, where and how to fix, never a traceback; a bug prints its traceback and exits
INTERNAL.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable

from hpctrain.cli import bench, jobs, run, runs, tools, tune, views
from hpctrain.cli.arguments import Parser, join_dashed_values
from hpctrain.errors import ExitCode, Preempted, UserError, exit_code_table
from hpctrain import process_clock


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="hpctrain", description="Train deep-learning models on GPU clusters, fast.",
        epilog="run 'hpctrain VERB --help' for a verb's options and examples\n\n"
               + exit_code_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_versions(),
                        help="hpctrain's version, and torch's and Python's beside it")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    for family in (run, jobs, tools, bench, runs, views, tune):
        family.add_verbs(verbs)
    return parser


def _versions() -> str:
    """What a bug report needs first, without importing torch (seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    from hpctrain.version import __version__
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "not installed"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"hpctrain {__version__} (torch {torch}, Python {python})"


def _split_recipe(args) -> None:
    """`hpctrain run key=value` has no recipe: the first positional is then an override."""
    if getattr(args, "recipe", None) and "=" in args.recipe:
        args.overrides = [args.recipe, *args.overrides]
        args.recipe = None


def _parse(argv: list[str] | None):
    """Like parse_args, but key=value overrides may also come after options
    (`hpctrain submit default --gpus 8 train.epochs=3`)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(join_dashed_values(argv))
    late = [a for a in extra if "=" in a and not a.startswith("-")]
    if len(late) != len(extra) or (late and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(a for a in extra if a not in late)}"
                     if len(late) != len(extra) else f"unrecognized arguments: {' '.join(late)}")
    if late:
        args.overrides = [*args.overrides, *late]
    return args


def main(argv: list[str] | None = None, own_process: bool = False) -> int:
    """The verb `argv` names; its exit code. `own_process`: hpctrain's own command
    (console.entry), which ends with the verb: stop signals after a run has ended leave its
    exit status as it is."""
    from hpctrain.train.preemption import catch_early, release_early

    # a run's time counts from its process's start (the interpreter and its imports: seconds)
    started = process_clock.started_at() if own_process else time.perf_counter()
    args = _parse(argv)
    args.started = started
    trains = args.verb in ("run", "profile")
    if trains:  # a stop signal must find them listening; the run's Stopper takes them over
        catch_early(until_exit=own_process)
    if args.verb in ("profile", "memory"):  # they run torch's profiler
        from hpctrain.profiling.kineto_log import quiet_without_gpu

        quiet_without_gpu()
    _split_recipe(args)
    try:
        return _dispatch(args, release_early if not trains else None)
    finally:
        if trains:
            release_early()
        made = sys.modules.get("hpctrain.data.user_datasets")  # a verb that read your data
        if made is not None:  # (only those import it: the others stay without torch)
            made.forget_made()  # the next verb in this process makes it again


def _dispatch(args, release_held: Callable[[], None] | None = None) -> int:
    """Run the verb; a user's mistake becomes its message and exit code. `release_held`: give
    back the signals held since the start (a Ctrl-C meanwhile is acted on there)."""
    try:
        if release_held is not None:
            release_held()
        return args.func(args)
    except UserError as err:
        print(f"hpctrain: error: {err}", file=sys.stderr)
        return err.exit_code
    except Preempted as stop:
        stop.tell()
        return stop.exit_code
    except KeyboardInterrupt as interrupt:  # a run's says its step and what it keeps
        print("hpctrain: interrupted" + (f" {interrupt}" if str(interrupt) else ""),
              file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception:  # a bug: its traceback, and the code that says so
        traceback.print_exc()
        print("hpctrain: internal error: the exception above was not expected. Where its "
              "traceback ends in your own model or dataset code, the bug is there; else "
              "please report it to hpctrain with the traceback", file=sys.stderr)
        return ExitCode.INTERNAL
