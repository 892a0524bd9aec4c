"""DataLoader workers, and every other helper process of a run, leave the stop signals to the
training process.

Slurm signals every process of a job step: `scancel` sends SIGTERM, `--signal=USR1@300` the
preemption notice, to the DataLoader workers as much as to the training process. A worker that
dies of either makes the DataLoader raise in the training process ("worker exited
unexpectedly"), which then fails instead of saving. So a worker ignores the preemption signal
and takes SIGTERM only from its parent, which is how the DataLoader shuts down a worker that
does not stop by itself (PyTorch's own worker handler does the same for the parent, and dies
of anyone else's SIGTERM): a thread waits for SIGTERM with sigwaitinfo, which tells who sent it.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group: a worker ignores it
(else each prints its own KeyboardInterrupt traceback), and the training process, interrupted,
shuts the workers down.

A worker ends with the training process, whoever its parent (monitor/lifeline.py).

No signal may reach a worker before that is set up: workers are forked with the stop signals
blocked; the training process unblocks them right after and then receives whatever came
meanwhile. multiprocessing's resource tracker (the helper that unlinks the semaphores and
shared memory of queues and shared counters) is started at the run's start under the same
block, which it keeps: it ignores SIGINT and SIGTERM by itself but dies of SIGUSR1, and its
successor then reports every resource as leaked (two KeyError tracebacks and a warning).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import weakref
from multiprocessing import resource_tracker

from torch.utils.data import DataLoader

from hpctrain.data.worker_death import from_torch
from hpctrain.errors import UserError
from hpctrain.monitor.lifeline import end_with
from hpctrain.monitor.stacks import arm_in_worker


def quiet_handle_sharing() -> None:
    """In a loader worker: a batch's tensors reach the training process as file descriptors,
    which it fetches from the worker's resource-sharer thread. A training process that stops
    (Ctrl-C) while it fetches leaves that thread with a ConnectionResetError, which it prints
    through sys.excepthook (a traceback under "hpctrain: interrupted"; multiprocessing stays
    quiet only once the worker's interpreter exits). Here a connection error that a thread
    other than the main one reports there is dropped: the main thread's are unchanged."""
    if getattr(sys.excepthook, "quiet_handle_sharing", False):
        return
    previous = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if issubclass(kind, (ConnectionError, EOFError)) and \
                threading.current_thread() is not threading.main_thread():
            return
        previous(kind, value, traceback)

    hook.quiet_handle_sharing = True
    sys.excepthook = hook


def _numbers(names: tuple[str, ...]) -> set[int]:
    return {getattr(signal, name) for name in {"SIGTERM", "SIGINT", *names}}


@contextlib.contextmanager
def blocked(names: tuple[str, ...]):
    """The stop signals held back in this thread (and in processes it forks) meanwhile."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _numbers(names))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_resource_tracker(names: tuple[str, ...]) -> None:
    """multiprocessing's resource tracker, started now (before anything registers a semaphore
    or a shared-memory segment with it) with the stop signals blocked for good. One already
    running is left as it is."""
    with blocked(names):
        resource_tracker.ensure_running()


def _take_sigterm_from_parent_only(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)


def spare_worker(names: tuple[str, ...], worker_id: int, then=None,
                 trainer: int | None = None) -> None:
    """A worker_init_fn: its stacks readable by the training process's hang watch
    (monitor/stacks.arm_in_worker); ignore the preemption signal(s) and SIGINT, SIGTERM only
    from the training process (`trainer`: its pid; the parent where not given: a worker
    started by a forkserver has the server for parent); a parent gone mid-fetch is not
    reported (quiet_handle_sharing); then your DataLoader's own worker_init_fn (`then`), if
    it had one. Runs with all still blocked from the fork; SIGTERM stays blocked, for the
    waiting thread."""
    trainer = os.getppid() if trainer is None else trainer
    arm_in_worker(trainer)
    quiet_handle_sharing()
    for number in _numbers(names) - {signal.SIGTERM}:
        signal.signal(number, signal.SIG_IGN)  # also drops one that came since the fork
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # (not forked: spawned)
    threading.Thread(target=_take_sigterm_from_parent_only, args=(trainer,), daemon=True,
                     name="sigterm-from-parent").start()
    # a worker started by a forkserver is the server's child, and the server lives while any
    # worker holds its pipe: torch's check of the parent would never see the trainer end
    end_with(trainer, lambda: os._exit(0))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _numbers(names) - {signal.SIGTERM})
    if then is not None:
        then(worker_id)


class SignalSafeLoader(DataLoader):
    """A DataLoader whose workers leave `stop_signals` (and SIGTERM) to this process (then run
    the worker_init_fn given, your DataLoader's)."""

    def __init__(self, *args, stop_signals: tuple[str, ...] = ("SIGUSR1",), **kwargs):
        if kwargs.get("num_workers", 0) > 0:
            kwargs["worker_init_fn"] = functools.partial(
                spare_worker, tuple(stop_signals), then=kwargs.get("worker_init_fn"),
                trainer=os.getpid())
        super().__init__(*args, **kwargs)
        self.stop_signals = tuple(stop_signals)
        self._opened: weakref.WeakSet = weakref.WeakSet()  # the passes with workers

    def __iter__(self):
        watcher = signal.getsignal(signal.SIGCHLD)
        with blocked(self.stop_signals):  # workers are forked here (the first time)
            batches = super().__iter__()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGCHLD, watcher)  # torch's: see _deaths_named
        if not self.num_workers:
            return batches
        self._opened.add(batches)
        return _deaths_named(batches)

    def close(self) -> None:
        """Stop the workers of every pass still open (a persistent pass's too), as torch does
        when an iterator is freed: a run that ended by an exception keeps its frames, and so
        its passes, in the traceback, which would keep idle workers alive for as long (in a
        notebook, until the next error). A next pass starts workers again."""
        for batches in list(self._opened):
            batches._shutdown_workers()  # torch's own shutdown, bounded by its joins
        self._opened.clear()
        self._iterator = None


def _deaths_named(batches):
    """The batches; a UserError a worker raised (batching.CheckedCollate's) as its own one line;
    a worker's death as DataPipelineFailed (worker_death.py), found where a
    batch is fetched (torch checks its workers while it waits, every 5 s), so between two
    steps. torch's own SIGCHLD handler, installed at its first iterator and put back above,
    raised the death wherever the training process was: inside an optimiser step, or in the
    clean-up after it."""
    try:
        yield from batches
    except UserError as err:  # raised in a worker: torch re-raised it with its traceback
        raise type(err)(str(err).rsplit(f"{type(err).__name__}: ", 1)[-1].strip()) from None
    except (RuntimeError, ConnectionError, EOFError) as err:
        failure = from_torch(err, "the next batch")
        if failure is None:
            raise
        raise failure from None
