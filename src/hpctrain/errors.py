"""The project's exception types.

A ``UserError`` is a mistake the user can fix (bad recipe, missing data, wrong device): the
CLI prints its message, never a traceback, and exits with its ``exit_code``. Anything else
that escapes is a bug and keeps its traceback.
"""

import sys


class UserError(Exception):
    """Bad usage, configuration or input: exit code 2."""

    exit_code = 2


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


class RunFailed(UserError):
    """The run started but could not finish (NaN loss, out of memory): exit code 1."""

    exit_code = 1


class Preempted(Exception):
    """The run saved a checkpoint and stopped early (preemption signal or time limit) and wants
    to be started again: exit code 75 (EX_TEMPFAIL, "try again later")."""

    exit_code = 75

    def __init__(self, message: str, requeue: bool = True):
        super().__init__(message)
        self.requeue = requeue  # False after SIGTERM: scancel, or Slurm requeues by itself
        self.quiet = False  # on ranks other than 0: rank 0 tells

    def tell(self) -> None:
        """What happened and what to do, on stderr (rank 0 only)."""
        if not self.quiet:
            print(f"hpctrain: {self} Run the same command again (resume=auto) to continue; "
                  f"exit status {self.exit_code} means 'requeue me'.", file=sys.stderr)
