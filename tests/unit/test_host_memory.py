"""What a model built in host memory is checked against (monitor/host_memory.py): the tightest
of the host's available memory, the job's cgroup limit and the address-space limit, each named.
The cgroup files are written here, in a folder standing in for /sys/fs/cgroup."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from hpctrain.monitor import host_memory

GiB = 1 << 30


def _proc(monkeypatch, files: dict[str, str]) -> None:
    """/proc's files as given (others as they are)."""
    real = host_memory._small
    monkeypatch.setattr(host_memory, "_small",
                        lambda path: files[str(path)] if str(path) in files else real(path))


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_the_job_s_cgroup_limit_bounds_what_the_host_has_free(monkeypatch, tmp_path, version):
    """A Slurm job of --mem=8G on a node with 500 GiB free may take what its cgroup leaves;
    the tightest level counts (a parent's limit binds its children)."""
    monkeypatch.setattr(host_memory, "CGROUPS", tmp_path)
    if version == "v2":
        job, parent = tmp_path / "slurm" / "job_7", tmp_path / "slurm"
        names, line = ("memory.max", "memory.current"), "0::/slurm/job_7\n"
    else:
        job, parent = tmp_path / "memory" / "slurm" / "job_7", tmp_path / "memory" / "slurm"
        names, line = ("memory.limit_in_bytes", "memory.usage_in_bytes"), \
            "4:memory:/slurm/job_7\n1:cpu:/\n"
    job.mkdir(parents=True)
    (job / names[0]).write_text("max\n" if version == "v2" else f"{2**63 - 4096}\n")
    (job / names[1]).write_text(f"{GiB}\n")
    (parent / names[0]).write_text(f"{8 * GiB}\n")
    (parent / names[1]).write_text(f"{3 * GiB}\n")
    _proc(monkeypatch, {"/proc/self/cgroup": line,
                        "/proc/meminfo": f"MemAvailable: {500 * GiB // 1024} kB\n"})
    found = host_memory.room()
    assert found.bytes == 5 * GiB
    assert found.bound == "memory the job's limit (8.0 GiB, its cgroup) leaves"


def test_the_address_space_limit_less_what_is_mapped_bounds_it_and_is_named(monkeypatch):
    monkeypatch.setattr(host_memory.resource, "getrlimit",
                        lambda which: (4 * GiB, resource.RLIM_INFINITY))
    _proc(monkeypatch, {"/proc/self/cgroup": "0::/\n",
                        "/proc/self/status": f"Name:\tpython\nVmSize:\t{3 * GiB // 1024} kB\n",
                        "/proc/meminfo": f"MemAvailable: {20 * GiB // 1024} kB\n"})
    found = host_memory.room()
    assert found.bytes == GiB and "address-space limit (ulimit -v 4.0 GiB, 3.0 GiB mapped)" \
        in found.bound


def test_unreadable_or_absent_bounds_are_left_out(monkeypatch, tmp_path):
    monkeypatch.setattr(host_memory, "CGROUPS", tmp_path)  # no cgroup files
    _proc(monkeypatch, {"/proc/self/cgroup": "garbage\n0::/nowhere\n",
                        "/proc/meminfo": "MemAvailable: lots kB\nMemFree:\n"})
    assert host_memory._field("/proc/meminfo", "MemAvailable:") is None  # "lots" is no number
    found = host_memory._available()  # the free pages the OS counts, instead
    assert found.bound == "memory available here" and found.bytes > 0
    assert host_memory._cgroup() is None
