"""Writing the files hpctrain owns: whole or not at all, and never through a link.

A file others read while it is written (a run's summary, a search's results, a picture) is
replaced at once: the whole new file or the old one, never half of each. Each write goes
through a fresh file of its own, created exclusively under a random name, so two processes
replacing the same file (a search's workers) do not take each other's partial file away,
and a link planted at a fixed temporary name receives nothing. The rename replaces a link at
the final name, not the file it points to. An appended file (metrics.jsonl) is opened
without following a link, and a folder hpctrain writes into (checkpoints/, tb/) is refused
when it is a link: whoever can write in a run directory could otherwise make a run write its
checkpoints, metrics or configuration into any file of the user running it.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from hpctrain.errors import OutputError

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def refuse_link(path: Path) -> OutputError:
    """The one-line refusal of a link where hpctrain writes."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return OutputError(f"{path} is a symbolic link{target}: hpctrain writes there and would "
                       "write through it, outside its own folder. Remove the link (a run "
                       "directory holds none: docs/reliability.md)")


def not_a_link(path: Path) -> Path:
    """`path`, refused when it is a link: a run directory hpctrain names inside a folder of its
    own (a search's trial, a scaling study's size), which a link would move elsewhere."""
    if Path(path).is_symlink():
        raise refuse_link(Path(path))
    return Path(path)


def fresh_file(path: Path, suffix: str = "") -> tuple[int, Path]:
    """A new, empty file beside `path` under a random name (`.NAME.RANDOM.partial` +
    `suffix`), created exclusively: its descriptor (open for writing) and its path."""
    path = Path(path)
    while True:
        partial = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial{suffix}")
        try:
            return os.open(partial, _NEW, 0o666), partial
        except FileExistsError:  # a name taken by chance, or planted
            continue


def fresh_folder(path: Path) -> Path:
    """A new, empty folder beside `path` under a random name (`.NAME.RANDOM.partial`), made
    exclusively (its parent made and refused when a link): where what becomes `path` is filled
    before it is renamed into place."""
    path = Path(path)
    own_folder(path.parent)
    while True:
        partial = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
        try:
            partial.mkdir()
            return partial
        except FileExistsError:  # a name taken by chance, or planted
            continue


def write_whole(path: Path, data: str | bytes, durable: bool = False) -> None:
    """`path` replaced at once by `data` (`durable`: on disk before the rename)."""
    path = Path(path)
    descriptor, partial = fresh_file(path)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def new_file(path: Path) -> BinaryIO:
    """`path` created for writing, exclusively: FileExistsError when anything is at the name,
    a link included (never written through). For a file of a folder just made (a checkpoint's),
    or a lock that must not replace another's."""
    return os.fdopen(os.open(path, _NEW, 0o666), "wb")


def truncate(path: Path, size: int) -> None:
    """`path` cut back to `size` bytes, never through a link (a resumed run's metrics.jsonl)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise refuse_link(path) from None
        raise
    try:
        os.ftruncate(descriptor, size)
    finally:
        os.close(descriptor)


def _appending(path: Path) -> int:
    """A descriptor appending to `path` (created when missing), never through a link."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                       | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise refuse_link(path) from None
        raise


@contextmanager
def replacing(path: Path) -> Iterator[BinaryIO]:
    """`with replacing(path) as handle:` a binary handle to a fresh file beside `path`, renamed
    over it when the block ends, removed when it fails: for what is written as it streams (an
    index, a copy of a shard), whole or not at all and never through a link."""
    descriptor, partial = fresh_file(Path(path))
    try:
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def open_appending(path: Path) -> TextIO:
    """`path` opened to append lines (created when missing), never through a link."""
    return os.fdopen(_appending(path), "a", buffering=1)


def append_durably(path: Path, data: bytes) -> None:
    """`data` appended to `path` in one write and on disk before this returns (a journal that
    other processes replay), never through a link; the file is made when missing."""
    descriptor = _appending(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view):]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def open_fresh(path: Path) -> TextIO:
    """`path` as a new, empty file open for writing lines (a log a child process writes
    into): made exclusively under a fresh name, then renamed to `path`, so a link planted at
    `path` is replaced, never written through."""
    descriptor, partial = fresh_file(Path(path))
    try:
        os.replace(partial, path)
    except BaseException:
        os.close(descriptor)
        partial.unlink(missing_ok=True)
        raise
    return os.fdopen(descriptor, "w", buffering=1)


def own_folder(path: Path) -> Path:
    """`path` as a folder to write in (made, with its parents, when missing), refused when it
    is a link."""
    path = Path(path)
    if path.is_symlink():
        raise refuse_link(path)
    path.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():  # made a link meanwhile
        raise refuse_link(path)
    return path


def write_png(path: Path, image) -> None:
    """A Pillow image as a PNG at `path`, replaced at once."""
    data = io.BytesIO()
    image.save(data, format="PNG")
    write_whole(path, data.getvalue())
