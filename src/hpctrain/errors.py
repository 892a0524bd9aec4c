"""The project's exception types and its one table of exit codes.

A ``UserError`` is a mistake the user can fix (bad recipe, missing data, wrong device), or a
run that could not finish for a reason its message names: the CLI prints its message, never a
traceback, and exits with its ``exit_code``. Anything else that escapes is a bug: it keeps its
traceback and exits INTERNAL.
"""

import enum
import sys
import textwrap


class ExitCode(enum.IntEnum):
    """Every exit status of hpctrain; docs/exit-codes.md's table and each verb's --help come
    from here (`exit_code_table`). 70, 74 and 75 are sysexits.h's; 76 is hpctrain's own."""

    DONE = 0
    FAILED = 1
    BAD_INPUT = 2
    DOES_NOT_FIT = 3
    INTERNAL = 70
    DATA_PIPELINE = 74
    STOPPED = 75
    HUNG = 76
    INTERRUPTED = 130


MEANINGS = {
    ExitCode.DONE: "done (a run: every step trained and its final weights evaluated)",
    ExitCode.FAILED: "the run failed: CUDA out of memory (with the settings that lower the "
                     "peak), a loss that stays NaN, a peer lost; the last good checkpoint is "
                     "kept; tune: 3 trials in a row failed; scale: no size finished; "
                     "prefetch: a download refused (no network, the server, a hash "
                     "mismatch); autotune: the recipe as given fails its trial",
    ExitCode.BAD_INPUT: "bad usage, configuration or input (the message names the key or "
                        "file and how to fix it); also files that cannot be written (a full "
                        "disk, a quota): the last good checkpoint is kept",
    ExitCode.DOES_NOT_FIT: "memory: the recipe does not fit the device (the advice says "
                           "what would); run or memory: a model whose parameters alone "
                           "exceed the memory it would be built in (counted on the meta "
                           "device, nothing allocated)",
    ExitCode.INTERNAL: "internal error: an unexpected exception, with its traceback: a bug in "
                       "hpctrain (please report it), or in your own model or dataset code "
                       "where the traceback ends there",
    ExitCode.DATA_PIPELINE: "the input pipeline failed mid-run: a loader worker died (out "
                            "of memory, a full /dev/shm, a crash in the dataset code); what "
                            "is consistent is saved, resume=auto continues",
    ExitCode.STOPPED: "stopped to be resumed: a stop signal or the time limit saved a "
                      "checkpoint; run it again with resume=auto (a job from submit "
                      "continues by itself; tune --dir DIR continues a search)",
    ExitCode.HUNG: "hung, requeue me: no progress past its bound (monitor.hang_after); the "
                   "stacks and the line naming where are in RUN_DIR/hang/, the last checkpoint "
                   "kept; resume=auto continues (a job from submit requeues itself, up to "
                   "monitor.hang_requeues times a run, then ends with 1)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C): stopped at once, the last checkpoint kept "
                          "(autotune: its trials so far written, the best unconfirmed)",
}


def exit_code_table(markdown: bool = False) -> str:
    """The exit codes and what each means: for --help, or as the Markdown table of
    docs/exit-codes.md and of the command reference."""
    if markdown:
        return "\n".join(["| code | meaning |", "|---|---|",
                          *(f"| {int(code)} | {text} |" for code, text in MEANINGS.items())])
    return "exit status:\n" + "\n".join(
        textwrap.fill(text, 88, initial_indent=f"  {int(code):>3}  ", subsequent_indent=" " * 7)
        for code, text in MEANINGS.items())


class UserError(Exception):
    """Bad usage, configuration or input: exit code 2."""

    exit_code = ExitCode.BAD_INPUT


class ConfigError(UserError):
    """The recipe or an override is invalid."""


class DataError(UserError):
    """The dataset is missing, empty or unreadable."""


class DeviceError(UserError):
    """The requested device or precision is not available on this machine."""


class OutputError(UserError):
    """The run's files could not be written: a full disk, a quota, a read-only file system.
    What was written before (the last good checkpoint) is kept."""


def cannot_write(what, err: OSError, then: str) -> OutputError:
    """An OutputError for `err` (errno text, not a traceback), then what to do."""
    return OutputError(f"cannot write {what}: {err.strerror or err}. {then}")


class DoesNotFit(UserError):
    """A model too large for the memory it would be built in, found by counting it on the
    meta device: exit code 3, before any allocation could take the machine down."""

    exit_code = ExitCode.DOES_NOT_FIT


class FetchFailed(UserError):
    """A download (hpctrain prefetch) that the network, the server or a hash check refused:
    exit code 1. Nothing partial is left in the cache."""

    exit_code = ExitCode.FAILED


class RunFailed(UserError):
    """The run started but could not finish (NaN loss, out of memory): exit code 1."""

    exit_code = ExitCode.FAILED


class DataPipelineFailed(UserError):
    """A loader worker died mid-run (killed, out of memory, a crash in native code): exit code
    74. Raised in the training process in place of the loader's own error."""

    exit_code = ExitCode.DATA_PIPELINE


class Preempted(Exception):
    """The run saved a checkpoint and stopped early (preemption signal or time limit) and wants
    to be started again: exit code 75 (EX_TEMPFAIL, "try again later")."""

    exit_code = ExitCode.STOPPED

    def __init__(self, message: str, requeue: bool = True):
        super().__init__(message)
        self.requeue = requeue  # False after SIGTERM: scancel, or Slurm requeues by itself
        self.quiet = False  # on ranks other than 0: rank 0 tells

    def tell(self) -> None:
        """What happened and what to do, on stderr (rank 0 only)."""
        if not self.quiet:
            print(f"hpctrain: {self} Run the same command again (resume=auto) to continue; "
                  f"exit status {self.exit_code} means 'requeue me'.", file=sys.stderr)
