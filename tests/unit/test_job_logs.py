"""A job's logs as `hpctrain logs` reads them (issue 69): a chunk at a time whatever their
size, a log that is a link (to /dev/zero, to another user's file) refused in one line, and a
text looked for across the chunks. The logs of real jobs are tests/cluster/test_slurm.py."""

from __future__ import annotations

import pytest

from hpctrain.cli.jobs import _print_log
from hpctrain.cluster.jobs import _holds
from hpctrain.errors import ConfigError
from hpctrain.readers import MiB


def test_a_log_is_printed_whole_a_chunk_at_a_time_from_where_it_was(tmp_path, capsys):
    log = tmp_path / "slurm-7.out"
    log.write_bytes(b"a" * (3 * MiB - 1) + "é".encode() + b"end\n")  # é across two chunks
    assert _print_log(log) == log.stat().st_size
    out = capsys.readouterr().out
    assert out.endswith("éend\n") and len(out) == 3 * MiB + 4
    with open(log, "ab") as more:
        more.write(b"next\n")
    assert _print_log(log, log.stat().st_size - 5) == log.stat().st_size
    assert capsys.readouterr().out == "next\n"


def test_a_log_that_is_a_link_is_one_line_and_never_read(tmp_path):
    log = tmp_path / "slurm-7.out"
    log.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match=r"slurm-7.out is a symbolic link, which hpctrain "
                                          "does not follow: a job's log"):
        _print_log(log)
    assert not _holds(log, b"anything")


def test_a_text_is_found_across_the_chunks_of_a_log(tmp_path):
    log = tmp_path / "slurm-7.out"
    log.write_bytes(b"x" * (MiB - 3) + b"needle" + b"y" * 10)
    assert _holds(log, b"needle") and not _holds(log, b"thread")
