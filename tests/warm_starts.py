"""`python -m hpctrain ...` started by the tests, forked from a process that has imported it.

The suite starts a few hundred `hpctrain` processes, and each interpreter spends about 3 s
importing torch, its checkpointing and its compiler before hpctrain does anything (a tiny run
is 3.5 s in all here; docs/benchmarks.md). Here a process (a "warm" one) imports what every
`hpctrain run` imports, then forks one process per start: the same main (run as `python -m`
runs it), with the caller's arguments, environment, working folder and standard files, in a
process of its own that takes signals, has children and ends with its exit status like any
other. What is shared is the interpreter's start and its imports.

`install()` makes every `subprocess.Popen([sys.executable, "-m", "hpctrain", ...])` of the
test process start this way (tests/conftest.py), and so do torchrun's agents (`python -m
torch.distributed.run`) and the benchmark scripts' smoke runs (`python benchmarks/SCRIPT.py`).
A benchmark script's own starts (its runs, an autotune, a torchrun) are forked by the same
warm process too: a smoke run proves the script runs, and no benchmark asks whether its runs
are its children (but `warm_starts.py`, which times cold starts). A warm torchrun agent forks
its workers (`python -u -m hpctrain ...`, `python -u SCRIPT.py ...`) from itself, so they stay
its children, in sessions of their own, as torchrun starts them (`_ForkedHere`); what hpctrain
starts in turn (an autotune's trials) starts the usual way, as its children, for a process
that has trained may not fork a process that trains. So does a command that cannot be started
faithfully so: a preexec_fn (but an `AddressSpaceLimit`, which the fork sets itself), passed
fds, another user, or a variable read while importing that differs from a warm process's. A
test of start-up itself asks for cold starts (`@pytest.mark.cold_start`).
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib
import json
import logging
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

# What the interpreter, torch and the libraries they load read when they start (and never
# again): a start that sets one of these otherwise than a warm process did needs its own.
_READ_AT_START = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "MALLOC_", "LD_", "TORCH",
                  "PYTORCH_", "CUDA_", "TMPDIR", "PYTHON")
_SET_PER_START = ("PYTHONPATH", "PYTHONUNBUFFERED")  # a forked start applies these itself
# Not read at start-up, though their prefixes say so: Lightning's import sets the first in the
# test process (torch reads it at each cuda.is_available()), torch.hub the second at each call
_READ_WHEN_ASKED = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCH_HOME")
# torch's optimisers import torch._dynamo; checkpoints torch.distributed.checkpoint
_IMPORTED_BY_EVERY_RUN = ("hpctrain.cli", "hpctrain.console", "hpctrain.train.loop",
                          "torch._dynamo", "torch.distributed.checkpoint")
# What torchrun sets for each worker that torch reads when the process group starts
_PER_WORKER = ("TORCHELASTIC_", "TORCH_NCCL_")
_MOST_WARM = 3  # processes of ~700 MB each, one per distinct start-up environment
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
WARM_MODULES = ("hpctrain", "torch.distributed.run")
_REAL_POPEN = subprocess.Popen
_WARM: dict[tuple, tuple[subprocess.Popen, str]] = {}
_TIMES_COLD_STARTS = BENCHMARKS / "warm_starts.py"


class AddressSpaceLimit:
    """A preexec_fn that limits the child's address space to `size` bytes (RLIMIT_AS): the
    tests' way to start a process in which a broken defence would allocate without bound. A
    forked start sets it itself before it runs, over the same imports a cold start makes
    under the limit."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self) -> None:
        resource.setrlimit(resource.RLIMIT_AS, (self.size, self.size))


def _what_starts(words: list[str], modules: tuple[str, ...] = WARM_MODULES,
                 scripts_in: Path | None = BENCHMARKS) -> dict | None:
    """`python -m MODULE ARGS` for one of `modules` (hpctrain; torchrun, whose workers a warm
    agent forks) or `python SCRIPT.py ARGS` for a script in `scripts_in` (the benchmarks' smoke
    tests; None: any script), as a request; None for any other command."""
    if words[0] != sys.executable or len(words) < 2:
        return None
    if words[1] == "-m" and len(words) > 2 and words[2] in modules:
        return {"module": words[2], "script": None, "args": words[3:]}
    script = Path(words[1]).resolve()
    if script.suffix == ".py" and scripts_in in (None, script.parent) and script.is_file():
        return {"module": None, "script": str(script), "args": words[2:]}
    return None


def _request(what: dict, environ: dict[str, str], new_session: bool, cwd, preexec_fn,
             p2cread: int, c2pwrite: int, errwrite: int) -> tuple[dict, list[int]]:
    """A forked start's request (what it runs, its environment, session, folder and address
    space limit) and its standard files, from what Popen hands `_execute_child` (-1: the
    caller's own)."""
    request = {**what, "env": environ, "new_session": bool(new_session),
               "cwd": os.path.abspath(os.fspath(cwd) if cwd is not None else "."),
               "address_space": preexec_fn.size if preexec_fn is not None else None}
    return request, [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                     errwrite if errwrite != -1 else 2]


def _start_key(env: dict[str, str], also_later: tuple[str, ...] = ()) -> tuple:
    """The variables of `env` read at start-up; `also_later`: prefixes of some read later."""
    return tuple(sorted((k, v) for k, v in env.items()
                        if k.startswith(_READ_AT_START)
                        and k not in _SET_PER_START + _READ_WHEN_ASKED
                        and not k.startswith(also_later)))


def _warm_socket(env: dict[str, str]) -> str | None:
    """The socket of a warm process for `env` (started now if none yet), or None."""
    key = _start_key(env)
    if _SERVED:  # a benchmark script's own start: only the warm process it was forked from
        return _SERVED if key == _start_key(_SERVED_ENV) else None
    if key in _WARM and _WARM[key][0].poll() is None:
        return _WARM[key][1]
    if len(_WARM) >= _MOST_WARM:
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="hpctrain-warm-"), "socket")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(_READ_AT_START) or k in _SET_PER_START}
    base.pop("PYTHONUNBUFFERED", None)
    log = Path(path).with_name("warm.log")
    with open(log, "wb") as output:  # the warm process keeps its own copy
        server = _REAL_POPEN([sys.executable, "-c", _SERVER, path, str(Path(__file__).parent)],
                             env={**base, **dict(key)},
                             stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                             start_new_session=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the warm process did not start: {log}")
        time.sleep(0.05)
    _WARM[key] = (server, path)
    return path


def stop_all() -> None:
    for server, _ in _WARM.values():
        server.kill()
        server.wait(timeout=30)
    _WARM.clear()


class WarmPopen(_REAL_POPEN):
    """subprocess.Popen that forks `python -m hpctrain` from a warm process where it can."""

    cold = False  # set while a test asks for cold starts
    _warm: _Waiter | None = None  # the forked start's waiter; None: started the usual way

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                       c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group):
        words = [os.fspath(a) for a in args] if isinstance(args, (list, tuple)) else None
        environ = dict(os.environ if env is None else env)
        plain = _plain(preexec_fn, pass_fds, shell, executable, gid, gids, uid, umask,
                       process_group)
        path = None
        what = _what_starts(words) if words and plain and not self.cold else None
        if what is not None:
            path = _warm_socket(environ)
        if path is None:
            return super()._execute_child(
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                errwrite, restore_signals, gid, gids, uid, umask, start_new_session,
                process_group)
        request, fds = _request(what, environ, start_new_session, cwd, preexec_fn, p2cread,
                                c2pwrite, errwrite)
        self._warm = _Waiter(path, request, fds)
        started = self._warm.line(timeout=60)
        if started is None:
            raise RuntimeError(f"the warm process at {path} forked nothing within 60 s")
        self.pid = int(started)
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _try_wait(self, wait_flags):
        if self._warm is None:
            return super()._try_wait(wait_flags)
        status = self._warm.line(timeout=None if wait_flags == 0 else 0)
        return (0, 0) if status is None else (self.pid, int(status))

    def _internal_poll(self, _deadstate=None, **kwargs):
        if self._warm is None:
            return super()._internal_poll(_deadstate, **kwargs)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                pid, status = self._try_wait(os.WNOHANG)
                if pid == self.pid:
                    self._handle_exitstatus(status)
            finally:
                self._waitpid_lock.release()
        return self.returncode


def _plain(preexec_fn, pass_fds, shell, executable, gid, gids, uid, umask,
           process_group) -> bool:
    """A start that asks nothing of the fork and exec between (a forked start gives none) but
    a limit to its address space."""
    return ((preexec_fn is None or isinstance(preexec_fn, AddressSpaceLimit)) and not pass_fds
            and not shell and executable is None and gid is None and not gids and uid is None
            and umask < 0 and process_group < 0)


class _ForkedHere(_REAL_POPEN):
    """subprocess.Popen in a warm torchrun agent: its workers (`python -u -m hpctrain ...`,
    `python -u SCRIPT.py ...`) are forked from the agent itself, so they are its children as
    with exec (its waits, its signals to them and their sessions hold) but do not import torch
    again. The agent has run no tensor operation (a fork after OpenMP's threads started is not
    safe), and what it set up for itself (signal handlers, exit functions, files, threads) is
    undone in the fork; a worker whose start-up environment differs from the warm process's
    starts the usual way."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                       c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group):
        words = [os.fspath(a) for a in args] if isinstance(args, (list, tuple)) else []
        environ = dict(os.environ if env is None else env)
        unbuffered = words[1:2] == ["-u"]
        what = _what_starts([words[0], *words[2:]] if unbuffered else words, ("hpctrain",),
                            None) if words else None
        if (what is None or not close_fds
                or not _plain(preexec_fn, pass_fds, shell, executable, gid, gids, uid, umask,
                              process_group)
                or _start_key(environ, _PER_WORKER) != _start_key(_SERVED_ENV, _PER_WORKER)):
            return super()._execute_child(
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                errwrite, restore_signals, gid, gids, uid, umask, start_new_session,
                process_group)
        if unbuffered:
            environ = {**environ, "PYTHONUNBUFFERED": "1"}  # what -u does to the standard files
        request, fds = _request(what, environ, start_new_session, cwd, preexec_fn, p2cread,
                                c2pwrite, errwrite)
        ready_read, ready_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(ready_read)
            _never_back(_become_here, request, fds, ready_write)
        os.close(ready_write)
        os.read(ready_read, 1)  # in its session, with its files: as a Popen returns after exec
        os.close(ready_read)
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


def install() -> None:
    subprocess.Popen = WarmPopen


def uninstall() -> None:
    subprocess.Popen = _REAL_POPEN
    stop_all()


class _Waiter:
    """The connection to the process that waits on one forked start: it sends the start's
    pid, then its wait status, a line each."""

    def __init__(self, path: str, request: dict, fds: list[int]):
        self.connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.connection.settimeout(60)
        self.connection.connect(path)
        body = json.dumps(request).encode()
        socket.send_fds(self.connection, [struct.pack("!I", len(body))], fds)
        self.connection.sendall(body)
        self.connection.settimeout(None)
        self.buffered = b""

    def line(self, timeout: float | None) -> str | None:
        """The next line; None where none came within `timeout` (None: no bound)."""
        while b"\n" not in self.buffered:
            ready, _, _ = select.select([self.connection], [], [], timeout)
            if not ready:
                return None
            chunk = self.connection.recv(4096)
            if not chunk:
                raise RuntimeError("the warm process's waiter went away")
            self.buffered += chunk
        line, _, self.buffered = self.buffered.partition(b"\n")
        return line.decode()


# ---- the warm process ---------------------------------------------------------------------

def _serve(path: str) -> None:
    """Import what every `hpctrain run` imports, then fork a waiter for each request."""
    for module in _IMPORTED_BY_EVERY_RUN:
        importlib.import_module(module)

    starter = os.getppid()
    _FRESH.update(signals={s: signal.getsignal(s) for s in signal.valid_signals()
                           if s not in (signal.SIGKILL, signal.SIGSTOP)},
                  logging=list(logging.root.handlers), faulthandler=faulthandler.is_enabled())
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped without a wait
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)
    listener.settimeout(1.0)
    while os.getppid() == starter:  # the test session that started it is alive
        try:
            connection, _ = listener.accept()
        except socket.timeout:
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _never_back(_wait_on, connection)
        connection.close()


def _never_back(run, *args) -> None:
    """A fork's work: it ends the process, and never returns into its parent's code."""
    try:
        run(*args)
    except BaseException:
        traceback.print_exc()
    os._exit(1)


def _wait_on(connection: socket.socket) -> None:
    """The waiter: fork the `hpctrain` process, tell its pid, then its wait status."""
    head, fds, _, _ = socket.recv_fds(connection, 4, 3)
    size, = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        body += connection.recv(size - len(body))
    request = json.loads(body)
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        connection.close()
        os.close(ready_read)
        _never_back(_become, request, fds, ready_write)
    os.close(ready_write)
    for fd in fds:
        os.close(fd)
    os.read(ready_read, 1)  # in its session, with its files: as a Popen returns after exec
    os.close(ready_read)
    connection.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    connection.sendall(f"{status}\n".encode())
    os._exit(0)


def _become(request: dict, fds: list[int], ready: int) -> None:
    """Turn this fork into `python -m hpctrain ARGS` (or `python SCRIPT ARGS`) as the request
    describes it; say so on `ready` before it runs."""
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    if request["address_space"] is not None:
        resource.setrlimit(resource.RLIMIT_AS, (request["address_space"],) * 2)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request["cwd"], *extra, *_BASE_PATH]
    if env.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)
    os.write(ready, b"1")
    os.close(ready)
    if request["module"] is not None:
        _run_module(request["module"], request["args"])
    else:
        _run_script(request["script"], request["args"])


def _become_here(request: dict, fds: list[int], ready: int) -> None:
    """`_become` in a fork of a torchrun agent: first undo what the agent set up for itself,
    as exec would (its signal handlers, but those it ignores; its exit functions, its log
    handlers, its files)."""
    for number, fresh in _FRESH["signals"].items():
        if fresh is not None and signal.getsignal(number) != signal.SIG_IGN:
            signal.signal(number, fresh)
    atexit._clear()
    logging.root.handlers[:] = _FRESH["logging"]
    if faulthandler.is_enabled() and not _FRESH["faulthandler"]:
        faulthandler.disable()
    keep = {*fds, ready}
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own fd, closed already
    _become(request, fds, ready)


def _run_module(name: str, args: list[str]) -> None:
    """As `python -m NAME ARGS` runs it: runpy's own path, in a `__main__` of its own (the
    data workers' start reads its spec)."""
    import runpy

    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.argv = ["-m", *args]  # runpy puts the module's file first
    if name == "torch.distributed.run":  # its workers forked from it
        from torch.distributed.elastic.multiprocessing.subprocess_handler import (
            subprocess_handler)

        subprocess_handler.Popen = _ForkedHere
    _end_as_the_interpreter(lambda: runpy._run_module_as_main(name, alter_argv=True))


def _run_script(script: str, args: list[str]) -> None:
    import runpy

    if Path(script).parent == BENCHMARKS and Path(script) != _TIMES_COLD_STARTS:
        install()  # a benchmark's starts forked by this warm process too
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)
    _end_as_the_interpreter(lambda: runpy.run_path(script, run_name="__main__"))


def _end_as_the_interpreter(run) -> None:
    """Call `run`, then end as the interpreter would: its exit status (SystemExit's, 1 after
    a traceback, SIGINT after an uncaught Ctrl-C), its threads joined, its exit functions."""
    import atexit
    import threading

    code = 0
    try:
        run()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def prepare_to_serve() -> None:
    """The warm process's start (`python -c _SERVER SOCKET TESTS`), before `_serve`: its
    outermost frame is `<string>`, and the frames below a start's module are named `<warm
    start>`, where a cold start has the interpreter's own (`<frozen runpy>`): what reads a
    started process's stacks (hpctrain's hang reports, "your code at ...") finds none of the
    tests' code there."""
    global _BASE_PATH, _SERVED, _SERVED_ENV
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    _BASE_PATH = [p for p in sys.path if p not in own and p not in ("", sys.argv[2])]
    _SERVED_ENV = dict(os.environ)
    _SERVED = sys.argv[1]
    for function in (_serve, _never_back, _wait_on, _become, _become_here, _run_module,
                     _run_script, _end_as_the_interpreter, _ForkedHere._execute_child):
        function.__code__ = _as_the_interpreters(function.__code__)


def _as_the_interpreters(code: types.CodeType) -> types.CodeType:
    inner = tuple(_as_the_interpreters(c) if isinstance(c, types.CodeType) else c
                  for c in code.co_consts)  # its lambdas
    return code.replace(co_filename="<warm start>", co_consts=inner)


_SERVER = "import sys; sys.path.insert(0, sys.argv[2]); import warm_starts as w; " \
    "w.prepare_to_serve(); w._serve(w._SERVED)"
_BASE_PATH: list[str] = []
_SERVED = ""  # the socket the warm process serves on; "" in the test process
_SERVED_ENV: dict[str, str] = {}  # the environment it imported in
_FRESH: dict = {}  # what a fresh interpreter has set up: signal handlers, log handlers
