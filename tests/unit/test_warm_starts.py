"""Which starts the suite's warm processes may fork (tests/warm_starts.py; the starts
themselves: tests/cluster/test_warm_starts.py)."""

import warm_starts


def test_a_variable_read_while_importing_gets_a_warm_process_of_its_own():
    """OMP_NUM_THREADS is read when the OpenMP runtime loads: a start that sets it otherwise
    is not forked from a process that read another value."""
    base = {"HOME": "/a", "PATH": "/bin"}
    assert warm_starts._start_key(base) == warm_starts._start_key({**base, "HOME": "/b"})
    assert warm_starts._start_key(base) != warm_starts._start_key(
        {**base, "OMP_NUM_THREADS": "1"})
    assert warm_starts._start_key(base) == warm_starts._start_key(
        {**base, "PYTHONPATH": "/mine"})  # a fork puts it on its path itself
