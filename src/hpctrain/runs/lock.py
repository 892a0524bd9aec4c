"""One run directory, one run: the lock a run holds on its directory for its whole life.

    <run_dir>/run.lock   {"pid", "host", "job_id", "restart", "started"} of the holder

The lock is created whole and exclusively (written to a file of its own, then hard-linked to
its name: a link fails when the name exists, on local disks and on NFS, GPFS and Lustre alike;
where a file system has no hard links, an exclusive create),
and its modification time is a heartbeat (touched every HEARTBEAT_SECONDS). A second run that
finds it is refused (RunInUse, exit 2), naming the holder, unless the holder is gone:

- it ran on this host and its process no longer exists;
- it was an earlier start of this same Slurm job (a requeue runs only after the job ended);
- its heartbeat is older than STALE_SECONDS (a dead node's process cannot be asked).

A gone holder's lock is taken over: renamed away (only one of two racing runs can rename it),
checked to be the lock that was judged, then replaced by this run's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.errors import ConfigError, cannot_write
from hpctrain import process_clock
from hpctrain.readers import (COUNT, TEXT, TIME, Kind, Unreadable, field_problem, json_document,
                              optional, read_capped)
from hpctrain.runs.directory import CAPS, LOCK, RunDir, modified
from hpctrain.runs.identity import HEARTBEAT_SECONDS, Heartbeat
from hpctrain.writers import fresh_file, new_file, refuse_link

STALE_SECONDS = 5 * HEARTBEAT_SECONDS  # a holder silent this long is taken for dead
# the lock's own beat: a job killed without a word is counted to within this (runs/goodput)
LOCK_BEAT_SECONDS = 1.0
ATTEMPTS = 5  # claims tried while other runs take over the same stale lock


# what a lock file must hold to name its holder (a time that describe() can print)
HOLDER_RULES = {"pid": Kind("a process id", lambda v: COUNT.holds(v) and v > 0),
                "host": TEXT, "job_id": optional(TEXT), "restart": COUNT, "started": TIME,
                "began": optional(TIME)}
HOLDER_REQUIRED = ("pid", "host", "job_id", "restart", "started")  # began: newer locks


class RunInUse(ConfigError):
    """Another living run holds the run directory (exit 2: a choice of the user's)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a run directory, as its lock records it."""

    pid: int
    host: str
    job_id: str | None
    restart: int
    started: float  # when it claimed the run
    began: float | None = None  # when its process started (None: a lock of an older hpctrain)

    @classmethod
    def this_process(cls, job_id: str | None, restart: int) -> Holder:
        return cls(os.getpid(), socket.gethostname(), job_id, restart, time.time(),
                   process_clock.started_epoch())

    @classmethod
    def read(cls, path: Path) -> Holder | None:
        """The holder a lock file names; None when it is unreadable or of another shape."""
        return cls.read_or_why(path)[0]

    @classmethod
    def read_or_why(cls, path: Path) -> tuple[Holder | None, str | None]:
        """(the holder a lock file names, None), or (None, why it names none)."""
        record, why = json_document(path, CAPS[LOCK])
        if why is None:
            why = "is not a JSON object" if not isinstance(record, dict) else \
                field_problem(record, HOLDER_RULES, HOLDER_REQUIRED)
        if why is not None:
            return None, why
        return cls(record["pid"], record["host"], record["job_id"], record["restart"],
                   float(record["started"]), record.get("began")), None

    def describe(self) -> str:
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        return (f"process {self.pid} on host {self.host}{job}, since "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.started))}")


def gone_why(holder: Holder | None, beat: float | None, me: Holder,
             now: float | None = None) -> str | None:
    """Why the run holding a lock is known to be gone (None: it may be alive). `beat`: the
    lock's modification time."""
    now = time.time() if now is None else now
    if beat is None:
        return "its lock vanished"
    if holder is not None and holder.host == me.host and not _alive(holder.pid):
        return f"process {holder.pid} on {holder.host} has ended"
    if holder is not None and holder.job_id and holder.job_id == me.job_id and \
            holder.restart != me.restart:
        return f"it was start {holder.restart + 1} of Slurm job {holder.job_id}, requeued since"
    if now - beat > STALE_SECONDS:
        return f"its heartbeat stopped {now - beat:.0f} s ago"
    return None


def held(run_dir: Path) -> bool:
    """Whether a living run may hold `run_dir` (its lock is there, and not known gone)."""
    lock_path = RunDir(run_dir).lock
    beat = modified(lock_path)
    if beat is None:
        return False
    return gone_why(Holder.read(lock_path), beat, Holder.this_process(None, -1)) is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


@dataclass
class RunLock:
    """This run's hold on its directory; `release()` ends it (and removes the folders the
    claim made, when the run left nothing in them). A copy sent to another rank (pickled)
    names the lock but does not hold it: its release does nothing."""

    path: Path
    made: list[Path] = field(default_factory=list)  # folders the claim created, outermost first
    taken_over: str | None = None  # why the previous holder was taken for gone, when it was
    claimed: float = 0.0  # when this run took the lock (its holder's `started`)
    # the holder taken over and its last heartbeat: a start that may have died before it
    # reported (runs/identity.record_start adds it to run.json)
    gone: tuple[Holder, float] | None = None
    # the last progress.json the holder taken over wrote (its last step and beat), if any
    gone_progress: dict | None = None
    heartbeat: Heartbeat | None = None
    held: bool = True

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    def __getstate__(self) -> dict:
        return {**self.__dict__, "heartbeat": None, "held": False, "made": []}

    def keep_folders(self) -> None:
        """Leave the folders the claim made when the lock is released: its caller goes on
        writing into the run directory."""
        self.made = []

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        try:
            self.path.unlink()
        except OSError:
            pass
        for folder in reversed(self.made):
            try:
                folder.rmdir()  # only when empty: a run that wrote something keeps its folder
            except OSError:
                break
        self.made = []


def _make_folders(folder: Path, exclusive: bool) -> list[Path]:
    """Create `folder` and its missing parents; those this call created, outermost first.
    Exclusive: FileExistsError when `folder` itself exists (another run took the name)."""
    made = []
    for path in [*reversed(folder.parents), folder]:
        if path != folder and path.is_dir():
            continue
        try:
            path.mkdir()
            made.append(path)
        except FileExistsError:
            if path == folder and exclusive:
                raise
    return made


def claim_new(output_dir: Path, base: str, job_id: str | None, restart: int) -> RunLock:
    """A run directory named `base` (or `base-2`, `base-3`, ... when taken) created for this
    run alone, and locked."""
    suffix = 1
    while True:
        run = output_dir / (base if suffix == 1 else f"{base}-{suffix}")
        try:
            made = _make_folders(run, exclusive=True)
        except FileExistsError:
            suffix += 1
            continue
        except OSError as err:
            raise cannot_write(run, err, "Choose an output_dir where you can write") from None
        return _hold(run, made, Holder.this_process(job_id, restart))


def claim(run: Path, job_id: str | None, restart: int, setting: str,
          instead: str = "run_name") -> RunLock:
    """Lock the existing or named run directory `run` for this run; RunInUse when a living
    run holds it. `setting` names what chose the directory, `instead` what chooses another,
    for the message."""
    me = Holder.this_process(job_id, restart)
    try:
        made = _make_folders(run, exclusive=False)
    except OSError as err:
        raise cannot_write(run, err, "Choose an output_dir where you can write") from None
    link = RunDir(run).first_link()
    if link is not None:
        raise refuse_link(link)
    lock_path = RunDir(run).lock
    taken_over, gone = None, None
    for _ in range(ATTEMPTS):
        try:
            lock = _hold(run, made, me)
            lock.taken_over, lock.gone = taken_over, gone
            lock.gone_progress = _progress_of(run, gone[0]) if gone else None
            return lock
        except FileExistsError:
            pass
        holder, unread = Holder.read_or_why(lock_path)
        beat = modified(lock_path)
        why = gone_why(holder, beat, me)
        if why is None:
            held = holder.describe() if holder is not None else \
                f"a run whose lock cannot be read (it {unread})"
            raise RunInUse(
                f"{setting}: {run} is in use by {held} (its lock: {lock_path}). Wait for it "
                f"to end, or choose another {instead}; if that process is gone, delete the "
                "lock file") from None
        if _set_aside(lock_path, holder, beat):
            taken_over, gone = why, (holder, beat) if holder is not None else None
    raise RunInUse(f"{setting}: {run}: other runs keep taking its lock ({lock_path}); "
                   "start one run at a time in a run directory")


def _progress_of(run: Path, holder: Holder) -> dict | None:
    """The run's progress.json where `holder` wrote it (read before this run's own replaces
    it), else None."""
    progress = RunDir(run).read_progress()
    if progress is not None and progress["pid"] == holder.pid and \
            progress["host"] == holder.host and progress["time"] >= holder.started:
        return progress
    return None


def _hold(run: Path, made: list[Path], me: Holder) -> RunLock:
    """Create the lock whole, or FileExistsError when another has it."""
    lock_path = RunDir(run).lock
    try:
        descriptor, draft = fresh_file(lock_path)
    except OSError as err:
        raise cannot_write(lock_path, err, "A run needs a run directory it can write in") \
            from None
    record = json.dumps(dataclasses.asdict(me)) + "\n"
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(record)
        _link_or_create(draft, lock_path, record)
    except FileExistsError:
        raise
    except OSError as err:
        raise cannot_write(lock_path, err, "A run needs a run directory it can write in") \
            from None
    finally:
        draft.unlink()
    heartbeat = Heartbeat(lock_path, every=LOCK_BEAT_SECONDS).start()
    return RunLock(lock_path, made, heartbeat=heartbeat, claimed=me.started)


def _link_or_create(draft: Path, lock_path: Path, record: str) -> None:
    """`lock_path` made whole from `draft` if it does not exist (FileExistsError if it does):
    a hard link; where the file system has none (some FUSE and object-store mounts), an
    exclusive create (which a link at the name fails too) written at once with `record`."""
    try:
        os.link(draft, lock_path)
        return
    except FileExistsError:
        raise
    except OSError:
        pass
    with new_file(lock_path) as lock:
        lock.write(record.encode())


def _set_aside(lock_path: Path, judged: Holder | None, beat: float | None) -> bool:
    """Remove the lock judged gone, unless another run replaced it meanwhile (then it is put
    back). True when this call removed it."""
    if beat is None:
        return False  # already gone: claim again
    aside = lock_path.with_name(f".{lock_path.name}.gone-{uuid.uuid4().hex}")
    try:
        os.rename(lock_path, aside)
    except FileNotFoundError:
        return False  # another run took it over first
    if Holder.read(aside) == judged and modified(aside) == beat:
        aside.unlink()
        return True
    try:  # a fresh lock of a run that took over first: back where it was
        _link_or_create(aside, lock_path, read_capped(aside, CAPS[LOCK]).decode(
            errors="replace"))
    except (FileExistsError, Unreadable):
        pass
    aside.unlink()
    return False
