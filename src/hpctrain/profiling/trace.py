"""Reading Kineto traces (the Chrome-trace JSON that torch.profiler writes), one event at a time.

A trace of a few steps of a large model runs to gigabytes; `json.load` would hold it several
times over as Python objects. `iter_events` instead decodes the `traceEvents` array object by
object from a sliding text buffer, so memory stays at one chunk plus what the caller keeps.
Plain and gzip-compressed files are read alike (`.json.gz` is what hpctrain writes: Perfetto
opens it as is).
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from hpctrain.errors import UserError

ARRAY_KEY = '"traceEvents"'
CHUNK = 1 << 20
_SEPARATORS = re.compile(r"[ \t\r\n,]*")
_EVENT_LINE = re.compile(rb"\n[ \t\r]*\{")
CUT_WINDOW = 1 << 16  # how far past its nominal offset a piece's cut is looked for


class TraceError(UserError):
    """A trace file that is missing, not a Kineto trace, or damaged: exit code 2."""


def _open(path: Path) -> BinaryIO:
    """The uncompressed bytes of a plain or gzip-compressed trace."""
    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if compressed else open(path, "rb")


def read_header(path: Path | str) -> dict:
    """The trace's top-level keys written before `traceEvents` (schemaVersion,
    deviceProperties, distributedInfo with the rank and world size, ...); {} if none parse."""
    path = Path(path)
    try:
        with _open(path) as stream:
            text = stream.read(CHUNK).decode("utf-8", errors="replace")
    except (OSError, EOFError) as err:
        raise TraceError(f"cannot read trace {path}: {err}") from None
    found = text.find(ARRAY_KEY)
    if found < 0:
        return {}
    try:
        return json.loads(text[:found] + ARRAY_KEY + ": []}")
    except json.JSONDecodeError:
        return {}


def part_ranges(path: Path | str, parts: int, least: int) -> list[tuple[int, int | None]]:
    """Nominal ranges, in bytes of the uncompressed trace, that split it into up to `parts`
    pieces of at least `least` bytes; the last ends at None (the end). Each piece really
    begins at its cut: the first line opening with `{` (where Kineto starts an event) within
    CUT_WINDOW bytes of its nominal start, which the piece before finds the same way. A cut
    is only a guess until the piece before it decodes to exactly there (iter_events)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as raw:
        if raw.read(2) == b"\x1f\x8b" and size >= 18:  # gzip: its trailer holds the
            raw.seek(-4, 2)                            # uncompressed size modulo 2**32
            size = struct.unpack("<I", raw.read(4))[0]
    pieces = min(parts, size // max(1, least))
    if pieces < 2:
        return [(0, None)]
    starts = [k * size // pieces for k in range(pieces)]
    return list(zip(starts, starts[1:] + [None]))


def _piece_bytes(raw: BinaryIO, start: int, end: int | None, chunk: int) -> Iterator[bytes]:
    """The bytes of a piece of the uncompressed trace `raw`: from the cut at `start` (0: the
    trace's start) to the cut at `end` (None: the trace's end). Both cuts are found in the
    same CUT_WINDOW bytes by the two pieces they separate, so the pieces tile the trace."""
    data, offset = b"", 0
    if start:
        raw.seek(start)  # forward: a gzip stream is decompressed up to here
        data = raw.read(CUT_WINDOW)
        cut = _cut(data, 0)
        data, offset = data[cut:], start + cut
    while True:
        more = raw.read(chunk)
        data += more
        if end is None or (more and offset + len(data) < end + CUT_WINDOW):
            ready = len(data) if end is None else min(len(data), max(0, end - offset))
            if ready:
                yield data[:ready]
                data, offset = data[ready:], offset + ready
            if not more:
                return
            continue
        yield data[:_cut(data, end - offset)]
        return


def _cut(data: bytes, at: int) -> int:
    """Where the first line opening with `{` within CUT_WINDOW bytes of `at` has its `{`."""
    found = _EVENT_LINE.search(data, at, at + CUT_WINDOW) if at >= 0 else None
    if found is None:
        raise TraceError(f"no line opens with {{ within {CUT_WINDOW} bytes of a piece's cut")
    return found.end() - 1


def iter_events(path: Path | str, chunk: int = CHUNK,
                part: tuple[int, int | None] = (0, None)) -> Iterator[dict]:
    """Every event of the trace's `traceEvents` array, in file order; with `part` (a range
    from part_ranges), the events of that piece only. A piece before the last must end
    where an event ends: one that ends inside an event, or finds the array closed, is
    refused with a TraceError like a damaged trace (its cut was in the wrong place)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace {path} does not exist")
    json_decoder = json.JSONDecoder()
    (start, end), decoder = part, codecs.getincrementaldecoder("utf-8")()
    last = end is None
    try:
        with _open(path) as raw:
            blocks = _piece_bytes(raw, start, end, chunk)
            buffer, position, at_end = "", -1 if start == 0 else 0, False

            def refill() -> bool:
                block = next(blocks, None)
                nonlocal buffer
                buffer += decoder.decode(block or b"", final=block is None)
                return block is not None

            while position < 0:  # find the array's opening bracket
                position = _array_start(buffer)
                if position < 0 and not refill():
                    raise TraceError(f"{path} is not a Kineto/Chrome trace: it has no "
                                     "traceEvents array")
            while True:
                # skip separators, reading on when the buffer runs out
                position = _SEPARATORS.match(buffer, position).end()
                while position >= len(buffer) and refill():
                    position = _SEPARATORS.match(buffer, position).end()
                if position >= len(buffer):
                    if not last:
                        return  # the piece ends between two events, as a cut must
                    raise TraceError(f"{path} ends inside its traceEvents array: the trace "
                                     "is truncated (was the profiled run killed while "
                                     "writing it?)")
                if buffer[position] == "]":
                    if not last:
                        raise TraceError(f"{path}: the traceEvents array closes before the "
                                         f"end of the piece from byte {start}")
                    return
                try:
                    event, after = json_decoder.raw_decode(buffer, position)
                except json.JSONDecodeError as err:
                    if at_end:  # no more to read: the event is cut short or damaged
                        raise _damage(path, err, buffer) from None
                    at_end = not refill()
                    continue
                at_end = False
                yield event
                position = after
                if position > chunk:  # drop what has been decoded, now and then
                    buffer, position = buffer[position:], 0
    except (OSError, EOFError, UnicodeDecodeError) as err:  # gzip's BadGzipFile too
        raise TraceError(f"cannot read trace {path}: {err}") from None


def _array_start(buffer: str) -> int:
    """Just past the traceEvents array's opening bracket, or -1 where not read yet."""
    found = buffer.find(ARRAY_KEY)
    bracket = buffer.find("[", found) if found >= 0 else -1
    return bracket + 1 if bracket >= 0 else -1


def _damage(path: Path, err: json.JSONDecodeError, buffer: str) -> TraceError:
    if err.pos >= len(buffer.rstrip()):
        return TraceError(f"{path} ends inside an event: the trace is truncated (was the "
                          "profiled run killed while writing it?)")
    return TraceError(f"{path}: damaged event near character {err.pos} of the current "
                      f"window: {err.msg}")
