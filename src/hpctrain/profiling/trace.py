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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hpctrain.errors import UserError

ARRAY_KEY = '"traceEvents"'
CHUNK = 1 << 20
_SEPARATORS = re.compile(r"[ \t\r\n,]*")
_EVENT_LINE = re.compile(rb"\n[ \t\r]*\{")


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


def part_ranges(path: Path | str, parts: int, least: int) -> list[tuple[int, int]]:
    """Byte ranges that split a plain trace into up to `parts` pieces of at least `least`
    bytes, each cut just before a line that opens with `{` (where Kineto starts an event).
    A cut is only a guess until the piece before it decodes to its end (see iter_events);
    a compressed trace cannot be entered in the middle and is one piece."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as raw:
        if raw.read(2) == b"\x1f\x8b" or parts < 2 or size < 2 * least:
            return [(0, size)]
        cuts, pieces = [0], min(parts, size // least)
        for offset in (k * size // pieces for k in range(1, pieces)):
            raw.seek(offset)
            found = _EVENT_LINE.search(raw.read(CHUNK))
            if found:
                cuts.append(offset + found.end() - 1)
    cuts = sorted(set(cuts))
    return list(zip(cuts, cuts[1:] + [size]))


@contextmanager
def _text(path: Path, start: int, end: int | None) -> Iterator[Callable[[int], str]]:
    """read(n) -> up to n more characters: of the whole trace (end None, compressed or not),
    or of bytes [start, end) of a plain one."""
    if end is None:
        with _open(path) as stream:
            yield stream.read
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as raw:
        raw.seek(start)

        def read(size: int) -> str:
            data = raw.read(max(0, min(size, end - raw.tell())))
            return decoder.decode(data, final=not data)
        yield read


def iter_events(path: Path | str, chunk: int = CHUNK,
                part: tuple[int, int] | None = None) -> Iterator[dict]:
    """Every event of the trace's `traceEvents` array, in file order; with `part` (a range
    from part_ranges), the events within those bytes only. A part must end where an event
    ends: one that ends inside an event, or finds the array closed before its last byte, is
    refused with a TraceError like a damaged trace (its cut was in the wrong place)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace {path} does not exist")
    scan = json.JSONDecoder().scan_once  # raw_decode without its Python wrapper
    if part is not None and part == (0, path.stat().st_size):
        part = None
    first, last = part is None or part[0] == 0, part is None or part[1] == path.stat().st_size
    try:
        with _text(path, *(part or (0, None))) as read:
            buffer, position, at_end = "", -1 if first else 0, False

            def refill() -> bool:
                text = read(chunk)
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
                # skip separators, reading on when the buffer runs out
                position = _SEPARATORS.match(buffer, position).end()
                while position >= len(buffer) and refill():
                    position = _SEPARATORS.match(buffer, position).end()
                if position >= len(buffer):
                    if not last:
                        return  # the part ends between two events, as a cut must
                    raise TraceError(f"{path} ends inside its traceEvents array: the trace "
                                     "is truncated (was the profiled run killed while "
                                     "writing it?)")
                if buffer[position] == "]":
                    if not last:
                        raise TraceError(f"{path}: the traceEvents array closes before the "
                                         f"end of bytes {part}")
                    return
                try:
                    event, end = scan(buffer, position)
                except (json.JSONDecodeError, StopIteration) as err:
                    where, what = (err.pos, err.msg) if isinstance(err, json.JSONDecodeError) \
                        else (position, "Expecting value")
                    if at_end and where >= len(buffer.rstrip()):
                        raise TraceError(f"{path} ends inside an event: the trace is "
                                         "truncated (was the profiled run killed while "
                                         "writing it?)") from None
                    if at_end:
                        raise TraceError(f"{path}: damaged event near character "
                                         f"{where} of the current window: {what}") from None
                    at_end = not refill()
                    continue
                at_end = False
                yield event
                position = end
                if position > chunk:  # drop what has been decoded, now and then
                    buffer, position = buffer[position:], 0
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise TraceError(f"cannot read trace {path}: {err}") from None
