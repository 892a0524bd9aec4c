"""Progress display for long work: a rich bar on a terminal; elsewhere (a job's log, a pipe)
a line every `LOG_EVERY` seconds, so that the log shows the work is alive and how far it is.
Work done within the first interval prints nothing."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

LOG_EVERY = 10.0  # seconds between the lines written where there is no terminal


@contextlib.contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yield an `advance(n)` function; draws a bar when stdout is a terminal, else writes a
    progress line every LOG_EVERY seconds."""
    if not sys.stdout.isatty():
        yield _lines(description, total)
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeRemainingColumn)

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn()]
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


def _lines(description: str, total: int | None) -> Callable[[int], None]:
    """advance(n) for a log: '<description>: 12,000 of 60,000 (20%), about 95 s left'."""
    started = time.monotonic()
    state = {"done": 0, "said": started}

    def advance(n: int = 1) -> None:
        state["done"] += n
        now = time.monotonic()
        if now - state["said"] < LOG_EVERY:
            return
        state["said"] = now
        done, elapsed = state["done"], now - started
        if total:
            left = elapsed * (total - done) / max(done, 1)
            line = f"{done:,} of {total:,} ({done / total:.0%}), about {left:,.0f} s left"
        else:
            line = f"{done:,} after {elapsed:,.0f} s"
        print(f"hpctrain: {description}: {line}", flush=True)
    return advance
