"""Data generated once into the cache (shapes, shapes3d, sampled ModelNet meshes).

The folder is filled under a private temporary name and renamed into place after a marker file
is written last: an interrupted generation is redone rather than trusted, and of two processes
generating at once (ranks of a node, jobs of an array) the first to finish wins.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from hpctrain.writers import fresh_folder, write_whole

MARKER = "complete.json"


def generate_once(folder: Path, make: Callable[[Path], dict]) -> Path:
    """`folder`, made by `make(tmp)` unless it is complete already; `make` fills the empty
    folder `tmp` and returns what the marker records."""
    if (folder / MARKER).exists():
        return folder
    tmp = fresh_folder(folder)
    try:
        write_whole(tmp / MARKER, json.dumps(make(tmp)))
    except BaseException:  # nothing half-made left beside the cache
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if (folder / MARKER).exists():  # another process finished first: keep theirs
        shutil.rmtree(tmp)
        return folder
    shutil.rmtree(folder, ignore_errors=True)  # an interrupted earlier generation
    tmp.rename(folder)
    return folder
