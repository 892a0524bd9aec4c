"""Every process hpctrain starts ends with the one that started it.

A parent killed with SIGKILL (an out-of-memory kill, `kill -9` of `hpctrain autotune`, a lost
node's cleanup) tells its children nothing: an autotune trial trained on for minutes after its
search was gone, and a loader worker started by a forkserver (a child of the server, which
lives as long as any worker holds its pipe) waited for batches for good. So a child follows
its starter's life itself: a thread blocks on a pidfd of the starter (Linux 5.3; every second
`kill(pid, 0)` where there is none) and ends the child when it ends.

hpctrain's own children find their starter in HPCTRAIN_STARTED_BY (`host:pid`, set by
`environment()`): a run then stops as on SIGTERM (it saves what it can), and ends within
GRACE_SECONDS regardless. A process on another host (a scheduler's launcher's task) leaves it
to the launcher, which ends its tasks when it ends.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time

VARIABLE = "HPCTRAIN_STARTED_BY"
GRACE_SECONDS = 30.0


def environment() -> dict[str, str]:
    """The environment entry that ties a child hpctrain starts to this process."""
    return {VARIABLE: f"{socket.gethostname()}:{os.getpid()}"}


def wait_for_end(pid: int) -> None:
    """Return when process `pid` has ended (at once when it is gone already)."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # an old kernel: look every second
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                pass
            time.sleep(1.0)
    select.select([handle], [], [])


def end_with(pid: int, then) -> None:
    """Call `then()` on a thread of its own once process `pid` has ended."""
    def follow() -> None:
        wait_for_end(pid)
        then()

    threading.Thread(target=follow, name="hpctrain-lifeline", daemon=True).start()


def follow_starter() -> None:
    """In a process hpctrain started (HPCTRAIN_STARTED_BY names it, on this host): when the
    starter ends, stop as on SIGTERM, and end within GRACE_SECONDS regardless."""
    host, _, pid = os.environ.get(VARIABLE, "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return

    def stop() -> None:
        deadline = threading.Timer(GRACE_SECONDS, os._exit, (int(signal.SIGTERM) + 128,))
        deadline.daemon = True
        deadline.start()
        os.kill(os.getpid(), signal.SIGTERM)

    end_with(int(pid), stop)
