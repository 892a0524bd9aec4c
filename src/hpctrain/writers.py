"""Writing a file that others read while it is written (a search's results, a picture, a
node's limits): the whole new file or the old one, never half of each. Each writer writes
through a file of its own, so two processes replacing the same file at once (a search's
workers) do not take each other's partial file away.
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path


def write_whole(path: Path, data: str | bytes) -> None:
    """`path` replaced at once by `data`."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    partial.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(partial, path)


def write_png(path: Path, image) -> None:
    """A Pillow image as a PNG at `path`, replaced at once."""
    data = io.BytesIO()
    image.save(data, format="PNG")
    write_whole(path, data.getvalue())
