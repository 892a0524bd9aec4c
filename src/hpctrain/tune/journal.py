"""A search's Optuna journal (study.journal), read and appended through hpctrain's doors.

Optuna's own file backend opens the journal by its name, following a link (a link there had
`hpctrain tune status` write through it), reads it without a cap (linked to /dev/zero: a
MemoryError), creates it when it is missing (a verb that only reads wrote the study folder) and
stops at a damaged line with a JSONDecodeError traceback. This backend implements Optuna's
published interface (`BaseJournalBackend`) instead: a regular file of at most JOURNAL_CAP bytes,
each line at most LINE_CAP and nested at most readers.MAX_DEPTH levels, a damaged line named by
its number, appends that never follow a link, and the file made only by a verb that writes.
Optuna's symlink lock (safe on NFS and Lustre) still orders the appends.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from optuna.storages.journal import BaseJournalBackend, JournalFileSymlinkLock

from hpctrain.errors import ConfigError
from hpctrain.readers import COUNT, MiB, TEXT, Unreadable, field_problem, open_capped, parse_json
from hpctrain.writers import append_durably, open_appending

JOURNAL_CAP = 4 << 30  # MOST_TRIALS trials of 100 evaluations each write about 1.3 GB
LINE_CAP = MiB  # one operation: a trial's parameters and attributes, some hundred bytes
OPERATION_RULES = {"op_code": COUNT, "worker_id": TEXT}


class DamagedJournal(ConfigError):
    """The journal cannot be read back: its path and what is wrong, in one line."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path} {why}: the search's record of its trials is damaged; "
                         "start a new search with another --dir (its trials' run "
                         "directories stay where they are)")


class StudyJournal(BaseJournalBackend):
    """study.journal as Optuna reads and appends it, within hpctrain's limits."""

    def __init__(self, path: Path, lock: JournalFileSymlinkLock, create: bool):
        self.path, self.lock = Path(path), lock
        self._offsets = {0: 0}  # operation number -> its line's byte offset, as Optuna's own
        if not self.path.is_symlink() and not self.path.exists() and not create:
            raise ConfigError(f"{self.path} is missing: a search records its trials there "
                              "(is this the search's folder?)")
        if create:
            open_appending(self.path).close()  # made when missing, never through a link

    def read_logs(self, log_number_from: int):
        """The operations from number `log_number_from` on, up to the file's size when
        opened (a writer may be appending meanwhile; an unfinished last line is left for the
        next read)."""
        try:
            handle = open_capped(self.path, JOURNAL_CAP)
        except FileNotFoundError:
            raise ConfigError(f"{self.path} is missing: a search records its trials there") \
                from None
        except Unreadable as err:
            raise DamagedJournal(self.path, str(err)) from None
        with handle:
            left = os.fstat(handle.fileno()).st_size
            number = max(n for n in self._offsets if n <= log_number_from)
            handle.seek(self._offsets[number])
            left -= self._offsets[number]
            while left > 0:
                line = handle.readline(min(LINE_CAP + 1, left))
                left -= len(line)
                if not line.endswith(b"\n"):
                    if len(line) > LINE_CAP:
                        raise DamagedJournal(self.path, f"line {number + 1:,} is longer than "
                                             f"{LINE_CAP:,} bytes")
                    return  # being written
                self._offsets[number + 1] = self._offsets[number] + len(line)
                if number >= log_number_from:
                    yield self._operation(line, number + 1)
                number += 1

    def _operation(self, line: bytes, number: int) -> dict:
        try:
            operation = parse_json(line)
        except Unreadable as err:
            raise DamagedJournal(self.path, f"line {number:,} {err}") from None
        except ValueError:
            raise DamagedJournal(self.path, f"line {number:,} is not JSON") from None
        why = "it is not a JSON object" if not isinstance(operation, dict) else \
            field_problem(operation, OPERATION_RULES, tuple(OPERATION_RULES))
        if why is not None:
            raise DamagedJournal(self.path, f"line {number:,} is not an Optuna operation "
                                 f"({why})")
        return operation

    def append_logs(self, logs: list[dict]) -> None:
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
        self.lock.acquire()  # bounded: a lock left unchanged past its grace is taken over
        try:
            append_durably(self.path, text.encode())
        finally:
            self.lock.release()


# what Optuna's replay of an operation raises when a field is missing or of another kind
REPLAY_ERRORS = (KeyError, TypeError, ValueError, AssertionError, IndexError, AttributeError,
                 OverflowError)


def replayed(make, path: Path):
    """The storage `make()` builds, which replays the whole journal: an operation Optuna
    cannot apply (a field missing or of another kind, in a crafted or damaged line) is named,
    where it was a KeyError or TypeError traceback from inside Optuna."""
    try:
        return make()
    except DamagedJournal:
        raise
    except REPLAY_ERRORS as err:
        raise DamagedJournal(path, "holds an operation Optuna cannot replay "
                             f"({type(err).__name__}: {str(err)[:120]})") from None
