"""A study folder's files that would be read without bound (issue 69): links to /dev/zero and
sparse files past their caps, met by `tune status`, `tune --dir` and `scale status` in a child of
4 GiB of address space (before: MemoryError at 3.7 GB). The crafted fields are
tests/unit/test_study_files.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launching import limited
from tune_studies import prepared


def _link_to_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _sparse(size: int):
    def spoil(path: Path) -> None:
        with open(path, "r+b") as handle:
            handle.truncate(size)
    return spoil


SEARCH_PROBES = {
    "tune.json a link to /dev/zero": ("tune.json", _link_to_zero,
                                      "tune.json is a symbolic link"),
    "tune.json a sparse 300 MB": ("tune.json", _sparse(300_000_000),
                                  "tune.json holds 300,000,000 bytes, more than the 1,048,576"),
    "the journal a link to /dev/zero": ("study.journal", _link_to_zero,
                                        "study.journal is a symbolic link"),
    "the journal a sparse 5 GB": ("study.journal", _sparse(5 << 30),
                                  "study.journal holds 5,368,709,120 bytes, more than the "
                                  "4,294,967,296"),
}


@pytest.mark.parametrize("probe", SEARCH_PROBES)
def test_a_search_s_files_that_would_read_without_end_are_one_line_in_bounded_memory(
        probe, tiny, tmp_path):
    folder, _ = prepared(tiny, tmp_path)
    name, spoil, words = SEARCH_PROBES[probe]
    spoil(folder / name)
    for verb in (["tune", "status", str(folder)], ["tune", "--dir", str(folder)]):
        code, _, err = limited(*verb, size=4 << 30)
        assert code == 2 and words in err and "Traceback" not in err, (probe, verb, err[-2000:])
        assert len(err.strip().splitlines()) == 1


def test_a_scaling_study_s_settings_linked_to_dev_zero_are_one_line(tiny, tmp_path):
    from hpctrain.tune import scale

    folder, _ = scale.prepare("default", tiny(), [1, 2], 10, False, 0.8,
                              str(tmp_path / "study"))
    _link_to_zero(folder / "scale.json")
    code, _, err = limited("scale", "status", str(folder), size=4 << 30)
    assert code == 2 and "scale.json is a symbolic link" in err and "Traceback" not in err, err
    assert os.readlink(folder / "scale.json") == "/dev/zero"  # left as found
