"""How loader workers start (`data.worker_start`): by default from a forkserver, a process
without threads, so that no worker can inherit a lock that a thread of the training process
held when it forked.

A fork copies the whole training process, locks included, but only the thread that forks:
a lock another thread held at that moment stays held in the child for good. CPython's own
interpreter lock of the thread states is one (gh-112275, fixed in 3.12; Python 3.11.7, this
project's and many clusters', deadlocks in PyOS_AfterFork_Child when a native thread enters
Python at the fork: benchmarks/fork_stress.py), a library's logging or allocator lock
another. A training process always has threads (hpctrain's heartbeats and watch, torch's,
the loaders' queue feeders). Python 3.14 made the forkserver Linux's default for this reason.

`auto` picks the forkserver where it can run the run's data: the process's main module is
hpctrain's own (the `hpctrain` command, `python -m hpctrain`, and the launchers that start either; a
forkserver's children import the main module again, which a script that calls
`hpctrain.fit` without an `if __name__ == "__main__":` guard would run again), and what the
workers are given pickles by reference to importable code (not to the script `__main__`).
Elsewhere it forks, as Python before 3.14 does, and says why. The forkserver imports torch and
hpctrain's data modules once, so each worker starts in milliseconds (a spawned one would take
seconds).
"""

from __future__ import annotations

import io
import multiprocessing
import pickle
import pickletools
import sys
from multiprocessing import forkserver

from hpctrain.data.worker_signals import blocked

PRELOAD = ["torch", "hpctrain.data.loader"]  # what every worker imports, once in the server
FORKSERVER, FORK = "forkserver", "fork"


def start_method(setting: str, stop_signals: tuple[str, ...], *given) \
        -> tuple[str, str | None]:
    """(how the workers start, why not from the forkserver where `auto` forks); `given`:
    what the workers are handed (datasets, collate, worker_init_fn). A forkserver is started
    now, importing torch while the run builds its model, with `stop_signals` blocked, as its
    workers keep them (worker_signals.py)."""
    method, why = setting, None
    if setting == "auto":
        if FORKSERVER not in multiprocessing.get_all_start_methods():
            return multiprocessing.get_start_method(), None
        why = _main_runs_again() or not_shippable(given)
        method = FORK if why is not None else FORKSERVER
    if method == FORKSERVER:
        multiprocessing.set_forkserver_preload(PRELOAD)
        with blocked(stop_signals):
            forkserver.ensure_running()
    return method, why


def _main_runs_again() -> str | None:
    """Why a forkserver's workers would run the main module's code again, or None."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if main is None or getattr(main, "__file__", None) is None:
        return None  # interactive: nothing to import again
    if spec is not None and spec.name.startswith("hpctrain."):
        return None  # python -m hpctrain, torchrun -m hpctrain
    entry = getattr(main, "entry", None)
    if getattr(entry, "__module__", None) == "hpctrain.console":
        return None  # the hpctrain command's script: it runs under its __main__ guard
    return (f"the main module is {main.__file__}, which a forkserver's workers would import "
            "again (data.worker_start=forkserver where it has an `if __name__ == "
            "\"__main__\":` guard)")


class _Shallow(pickle.Pickler):
    """A pickler that stands in for tensors and arrays (what they hold ships through shared
    memory, not pickle) and for multiprocessing's shared values, locks and queues (they ship
    only while a worker is started), keeping only what the object graph references."""

    def persistent_id(self, obj):
        module = getattr(type(obj), "__module__", "") or ""
        if module.startswith(("torch", "numpy")) and hasattr(obj, "shape") or \
                module.startswith("multiprocessing"):
            return id(obj)
        return None


def not_shippable(given) -> str | None:
    """Why what the workers are handed cannot reach a forkserver's workers, or None: it does
    not pickle (a lambda, a local class, an open file), or it names the script `__main__`."""
    buffer = io.BytesIO()
    try:
        _Shallow(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(
            [item for item in given if item is not None])
    except Exception as err:  # whatever the object's own __reduce__ raises
        return f"what the workers are given does not pickle ({type(err).__name__}: {err})"
    strings = [arg for op, arg, _ in pickletools.genops(buffer.getvalue())
               if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "GLOBAL")]
    if "__main__" in strings or any(str(s).startswith("__main__ ") for s in strings):
        return "your data is defined in the script __main__, which a forkserver cannot import"
    return None
