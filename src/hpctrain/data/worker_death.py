"""A loader worker that dies mid-run (killed by the kernel's out-of-memory killer, a full
/dev/shm, a crash in native decoding code), said the same way for either loader: one line,
exit code DATA_PIPELINE (errors.ExitCode), never torch's traceback.

torch's DataLoader raises a RuntimeError whose message starts with "DataLoader worker (pid":
"... is killed by signal: Killed.", "... exited unexpectedly with exit code 1.", or "(pid(s)
...) exited unexpectedly"; or, when the worker dies while the training process takes over its
batch's shared memory, the connection's own error (ConnectionResetError, EOFError). The batch
buffers (batch_buffers.py) see their worker's exit status themselves.
"""

from __future__ import annotations

import re
import signal

from hpctrain.errors import DataPipelineFailed

_TORCH_DEATH = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (.*?)(?:\. |\.$|$)")


WHY = ("out of memory (dmesg), a full /dev/shm (df -h /dev/shm) or a crash in the dataset "
       "code. Lower data.num_workers or data.prefetch_factor, or run with data.num_workers=0 to "
       "see the dataset's own error")


def worker_died(pid: int | str, how: str, what: str) -> DataPipelineFailed:
    """The error for a worker (`pid`) that died (`how`: 'killed by SIGKILL', 'exited with
    status 1') while making `what`."""
    return DataPipelineFailed(f"input worker (pid {pid}) {how} while making {what}: {WHY}")


def how_it_died(exitcode: int | None) -> str:
    """A process's exit code (negative: the signal that killed it) in words."""
    if exitcode is not None and exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with status {exitcode}"


def from_torch(err: Exception, what: str) -> DataPipelineFailed | None:
    """torch's error for a dead DataLoader worker as a DataPipelineFailed; None for any other
    error."""
    if isinstance(err, (ConnectionError, EOFError)):
        return DataPipelineFailed(f"an input worker died while handing over {what} "
                                  f"({type(err).__name__}: {err}): {WHY}")
    found = _TORCH_DEATH.search(str(err))
    if found is None:
        return None
    how = found.group(2).strip().rstrip(".")
    killed = re.match(r"is killed by signal: (.+)", how)
    if killed:  # torch gives strsignal's words ("Killed"); the signal's name is what one greps
        names = {signal.strsignal(number): number.name for number in signal.Signals}
        how = f"was killed by {names.get(killed.group(1), killed.group(1))}"
    return worker_died(found.group(1).strip(), how, what)
