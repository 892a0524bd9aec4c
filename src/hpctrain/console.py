"""The `hpctrain` command (and `python -m hpctrain`): its first act is to hold Ctrl-C.

Python turns Ctrl-C into KeyboardInterrupt wherever the main thread is, and during start-up
that is inside the import of NumPy or torch (seconds): a traceback, a half-imported NumPy that
fails later with a RecursionError, or an interrupt swallowed by a library's import fallback and
lost, the run training on to exit 0. Held from here (preemption.catch_early), a Ctrl-C is
acted on where hpctrain can: when the verb starts (cli.main), or for `run` and `profile` when
the run's Stopper takes the held signals over; it ends as "interrupted" with exit 130.
"""

from __future__ import annotations

import sys


def entry() -> None:
    from hpctrain.train.preemption import catch_early

    catch_early(("SIGINT",))
    from hpctrain.errors import ExitCode
    from hpctrain.monitor.lifeline import follow_starter

    follow_starter()  # a process hpctrain started ends with its starter
    if (exit_seconds := _exit_seconds()) is None:
        _end(ExitCode.BAD_INPUT)

    try:
        from hpctrain.cli import main

        code = main(own_process=True)
    except KeyboardInterrupt:  # one held, handed back where no verb was left to catch it
        print("hpctrain: interrupted", file=sys.stderr)
        code = ExitCode.INTERRUPTED
    _exit_within(code, exit_seconds)
    _end(code)


EXIT_SECONDS = 15.0  # from the verb's end to the process's, whatever is left running
EXIT_SECONDS_VARIABLE = "HPCTRAIN_EXIT_SECONDS"  # another bound (children inherit it)


def _exit_seconds() -> float | None:
    """EXIT_SECONDS, or the environment's bound; None (said why) where that is no finite
    positive number of seconds."""
    import os

    given = os.environ.get(EXIT_SECONDS_VARIABLE)
    if given is None:
        return EXIT_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = 0.0
    if 0 < seconds < float("inf"):  # nothing waits forever
        return seconds
    print(f"hpctrain: {EXIT_SECONDS_VARIABLE}={given!r} is not a finite positive number of "
          f"seconds; unset it for the default, {EXIT_SECONDS:g}", file=sys.stderr)
    return None


def _exit_within(code: int, seconds: float) -> None:
    """The process ends with `code` within `seconds`, whatever its exit functions wait for (a
    compile worker pool, a child that does not stop, a hook of the user's): the verb's
    records are written by now."""
    import os
    import threading

    def end() -> None:
        print(f"hpctrain: the process did not end within {seconds:g} s of its verb "
              "(its exit functions waited on threads or child processes): ended",
              file=sys.__stderr__, flush=True)
        os._exit(code)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()


def _end(code: int) -> None:
    """Exit with `code` once the exit functions ran (multiprocessing's stops the loader
    workers), without the interpreter's teardown of every module: it took a second after
    a run's last record with torch loaded (0.6 s for torch alone), which no account of the
    job would count, and it waited for any thread not made a daemon. And CPython 3.11 marks
    a KeyboardInterrupt raised inside exec()'d code as unhandled even where hpctrain caught
    it (a Ctrl-C while torch makes the dataclasses of a module it imports lazily, as
    torch.optim does with torch._dynamo on its first optimiser), and then ends by SIGINT
    whatever sys.exit said."""
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe
            pass
    os._exit(code)
