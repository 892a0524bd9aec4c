"""The process layout read from the launchers' variables, and the checks made before any
process group starts: the tests that train, in this process or in an `hpctrain` process of
their own (the others are tests/unit/test_environment.py)."""

import os
import subprocess
import sys

import pytest

from hpctrain.cluster.slurm import expand_hostlist
from hpctrain.errors import ConfigError
from step_layouts import SLURM_STEP
from warm_starts import AddressSpaceLimit


def test_a_rank_past_the_process_count_stops_a_run_at_once_not_in_the_rendezvous(tiny):
    """SLURM_PROCID=5 of 2 tasks: one line and exit 2 within seconds (before: killed after
    714 s waiting for the other processes)."""
    done = subprocess.run([sys.executable, "-m", "hpctrain", "run", "default", *tiny()],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **SLURM_STEP, "SLURM_PROCID": "5"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
    assert "SLURM_PROCID=5 but SLURM_STEP_NUM_TASKS=2" in done.stderr


HUGE = """
from hpctrain.cluster.environment import detect
from hpctrain.cluster.slurm import tasks_per_node
from hpctrain.errors import ConfigError
env = detect({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1",
              "SLURM_STEP_NODELIST": "n[0-999999999]"})
try:
    tasks_per_node("4(x999999999)")
except ConfigError as err:
    print(env.master_addr, err)
"""


def test_a_huge_host_list_or_layout_is_not_expanded_in_full():
    """'n[0-999999999]' expanded in full ran out of memory (23 GB) to find its first host; a
    layout '4(x999999999)' likewise. In a child limited to 1 GiB of address space."""
    done = subprocess.run([sys.executable, "-c", HUGE], capture_output=True, text=True,
                          timeout=60, preexec_fn=AddressSpaceLimit(1 << 30))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("n0 cannot read the Slurm task layout '4(x999999999)'")
    with pytest.raises(ConfigError, match="host list 'n\\[a-b\\]'"):
        expand_hostlist("n[a-b]")
