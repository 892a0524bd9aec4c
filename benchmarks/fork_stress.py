"""Loader starts while native threads enter Python (issue 65): how many hang, by start method.

CPython before 3.12 (3.11.7 here and on many clusters) takes its lock of the thread states
without the interpreter lock when a native thread first enters Python (PyGILState_Ensure);
a fork at that moment copies the lock held into the child, which deadlocks on it in
PyOS_AfterFork_Child before its first line (gh-112275). A training process has such threads
(torch's, NCCL's and CUDA's callbacks, a tokenizer's pool). Here `--threads` threads start
native threads (pthread_create through ctypes) that enter Python and end, over and over,
with the interpreter lock handed over every 10 us, while the main thread starts `--starts`
loaders of one worker each through hpctrain's own loader class (data/worker_signals.SignalSafeLoader),
sleeping `--gap` seconds between starts as a training process waits on its device. A start
whose batch does not come within `--patience` seconds hangs (its worker is killed). The
table gives each start method's hangs.

    python benchmarks/fork_stress.py                               # 1,000 starts each
    python benchmarks/fork_stress.py --starts 100 --methods forkserver
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from hpctrain.data.worker_signals import SignalSafeLoader  # noqa: E402
from hpctrain.data.worker_start import start_method  # noqa: E402

SWITCH_SECONDS = 1e-5
_START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


@_START
def _enter_python(argument):  # a native thread's call into Python: PyGILState_Ensure
    return None


class Four(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return torch.tensor(index)


def churn(stop: threading.Event) -> None:
    """Native threads that enter Python once and end, one after another, until `stop`."""
    libc = ctypes.CDLL(None)
    libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, _START,
                                    ctypes.c_void_p]
    libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    thread = ctypes.c_ulong()
    while not stop.is_set():
        if libc.pthread_create(ctypes.byref(thread), None, _enter_python, None) == 0:
            libc.pthread_join(thread.value, None)


def stress(method: str, starts: int, threads: int, gap: float, patience: float,
           first: bool = False) -> tuple[int, int, float]:
    """(loader starts that hung, starts made, seconds) with `threads` churning threads;
    `first`: stop at the first hang."""
    stop = threading.Event()
    # the interpreter lock handed over as often as a training process's main thread lets go
    # of it (each CUDA call, each read): every handover lets a native thread in
    sys.setswitchinterval(SWITCH_SECONDS)
    churners = [threading.Thread(target=churn, args=(stop,), daemon=True)
                for _ in range(threads)]
    for churner in churners:
        churner.start()
    hung, made, began = 0, 0, time.perf_counter()
    try:
        for _ in range(starts):
            made += 1
            loader = SignalSafeLoader(Four(), batch_size=4, num_workers=1, timeout=patience,
                                      multiprocessing_context=method)
            try:
                next(iter(loader))
            except RuntimeError as err:  # "DataLoader timed out after N seconds"
                if "timed out" not in str(err):
                    raise
                hung += 1
                for child in multiprocessing.active_children():
                    child.kill()
                if first:
                    break
            del loader
            time.sleep(gap)
    finally:
        stop.set()
        sys.setswitchinterval(0.005)
    return hung, made, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=1000)
    parser.add_argument("--methods", nargs="+", default=["fork", "forkserver"])
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--gap", type=float, default=0.005)
    parser.add_argument("--patience", type=float, default=5.0)
    parser.add_argument("--first", action="store_true", help="stop a method at its first hang")
    args = parser.parse_args()
    python = ".".join(map(str, sys.version_info[:3]))
    print(f"Python {python}, {args.threads} threads starting native threads that enter "
          f"Python, {args.starts} loader starts each")
    print(f"{'start':<11} {'hung':>6} {'starts':>7} {'share':>8} {'seconds':>9}")
    for method in args.methods:
        if method == "forkserver":
            start_method("forkserver", ())  # hpctrain's: torch preloaded, started now
        hung, made, seconds = stress(method, args.starts, args.threads, args.gap,
                                     args.patience, args.first)
        print(f"{method:<11} {hung:>6} {made:>7} {hung / made:>8.2%} {seconds:>9.1f}",
              flush=True)
    os._exit(0)  # a worker stuck in its fork is no child to wait for


if __name__ == "__main__":
    main()
