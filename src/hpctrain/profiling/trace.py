"""Reading Kineto traces (the Chrome-trace JSON that torch.profiler writes), one event at a time.

A trace of a few steps of a large model runs to gigabytes; `json.load` would hold it several
times over as Python objects. `iter_events` instead decodes the `traceEvents` array object by
object from a sliding text buffer, so memory stays at one chunk plus what the caller keeps.
Plain and gzip-compressed files are read alike (`.json.gz` is what hpctrain writes: Perfetto
opens it as is).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from hpctrain.errors import UserError

ARRAY_KEY = '"traceEvents"'
CHUNK = 1 << 20


class TraceError(UserError):
    """A trace file that is missing, not a Kineto trace, or damaged: exit code 2."""


def _open(path: Path):
    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if compressed else \
        open(path, encoding="utf-8")


def read_header(path: Path | str) -> dict:
    """The trace's top-level keys written before `traceEvents` (schemaVersion,
    deviceProperties, distributedInfo with the rank and world size, ...); {} if none parse."""
    path = Path(path)
    try:
        with _open(path) as stream:
            text = stream.read(CHUNK)
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise TraceError(f"cannot read trace {path}: {err}") from None
    found = text.find(ARRAY_KEY)
    if found < 0:
        return {}
    try:
        return json.loads(text[:found] + ARRAY_KEY + ": []}")
    except json.JSONDecodeError:
        return {}


def iter_events(path: Path | str, chunk: int = CHUNK) -> Iterator[dict]:
    """Every event of the trace's `traceEvents` array, in file order."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace {path} does not exist")
    decoder = json.JSONDecoder()
    try:
        with _open(path) as stream:
            buffer, position, at_end = "", -1, False

            def refill() -> bool:
                text = stream.read(chunk)
                nonlocal buffer
                buffer += text
                return bool(text)

            while position < 0:  # find the array's opening bracket
                found = buffer.find(ARRAY_KEY)
                if found >= 0 and (bracket := buffer.find("[", found)) >= 0:
                    position = bracket + 1
                elif not refill():
                    raise TraceError(f"{path} is not a Kineto/Chrome trace: it has no "
                                     "traceEvents array")
            while True:
                while True:  # skip separators, reading on when the buffer runs out
                    while position < len(buffer) and buffer[position] in " \t\r\n,":
                        position += 1
                    if position < len(buffer) or not refill():
                        break
                if position >= len(buffer):
                    raise TraceError(f"{path} ends inside its traceEvents array: the trace "
                                     "is truncated (was the profiled run killed while "
                                     "writing it?)")
                if buffer[position] == "]":
                    return
                try:
                    event, end = decoder.raw_decode(buffer, position)
                except json.JSONDecodeError as err:
                    if at_end and err.pos >= len(buffer.rstrip()):
                        raise TraceError(f"{path} ends inside an event: the trace is "
                                         "truncated (was the profiled run killed while "
                                         "writing it?)") from None
                    if at_end:
                        raise TraceError(f"{path}: damaged event near character "
                                         f"{err.pos} of the current window: {err.msg}") from None
                    at_end = not refill()
                    continue
                at_end = False
                yield event
                position = end
                if position > chunk:  # drop what has been decoded, now and then
                    buffer, position = buffer[position:], 0
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise TraceError(f"cannot read trace {path}: {err}") from None
