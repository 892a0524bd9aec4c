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

    try:
        from hpctrain.cli import main

        code = main(own_process=True)
    except KeyboardInterrupt:  # one held, handed back where no verb was left to catch it
        print("hpctrain: interrupted", file=sys.stderr)
        code = ExitCode.INTERRUPTED
    if code == ExitCode.INTERRUPTED:
        _exit_interrupted(code)
    _exit_within(code, EXIT_SECONDS)
    sys.exit(code)


EXIT_SECONDS = 15.0  # from the verb's end to the process's, whatever is left running


def _exit_within(code: int, seconds: float) -> None:
    """The process ends with `code` within `seconds`, whatever the interpreter's shutdown
    waits for (a thread someone did not make a daemon, a compile worker pool, an exit hook
    joining a stuck child): the verb's records are written by now."""
    import os
    import threading

    def end() -> None:
        print(f"hpctrain: the process did not end within {seconds:.0f} s of its verb "
              "(threads or child processes left running): ended", file=sys.__stderr__,
              flush=True)
        os._exit(code)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()


def _exit_interrupted(code: int) -> None:
    """Exit with `code` after the exit functions. CPython 3.11 marks a KeyboardInterrupt
    raised inside exec()'d code as unhandled even where hpctrain caught it (a Ctrl-C while
    torch makes the dataclasses of a module it imports lazily, as torch.optim does with
    torch._dynamo on its first optimiser), and then ends by SIGINT whatever sys.exit said."""
    import atexit
    import os

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
