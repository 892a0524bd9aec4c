"""A real, throw-away Slurm cluster on this machine for the `slurm` tests.

Two emulated nodes (n1, n2: two slurmd daemons on one host) with 4 fake GPUs each (character
devices; no CUDA behind them, so training falls back to CPU and gloo). Everything lives in a
temporary folder and is found through SLURM_CONF, so no system configuration is touched
except one /etc/hosts line that lets n1 and n2 resolve. Only the daemons started here are
stopped, by PID. Needs root (slurmd launches the jobs); installs Debian's packages if they
are missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
CTLD_PORT = 16817
NODE_PORTS = {"n1": 17101, "n2": 17102}


def ensure_installed() -> None:
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if os.geteuid() != 0:
        raise RuntimeError("the slurm tests need root to install and run Slurm")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def _wait_for(check, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


class LocalSlurm:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.pids: list[int] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        for sub in ("state", "log", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(4):
            device = self.root / "dev" / f"fakegpu{i}"
            if not device.exists():
                os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # like /dev/null
        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=8 "
            f"RealMemory=8000 Gres=gpu:4 State=UNKNOWN" for name, port in NODE_PORTS.items())
        r = self.root
        self.conf.write_text(f"""ClusterName=hpctraintest
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort={CTLD_PORT}
AuthType=auth/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ReturnToService=2
KillWait=5
MinJobAge=300
InactiveLimit=0
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
{nodes}
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
""")
        (self.root / "gres.conf").write_text(
            f"NodeName=n[1-2] Name=gpu File={r}/dev/fakegpu[0-3]\n")

    def _start_munge(self) -> None:
        probe = subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
        if probe.returncode == 0:
            return  # a munged is already serving this machine
        for folder in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
            Path(folder).mkdir(parents=True, exist_ok=True)
            shutil.chown(folder, "munge", "munge")
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            key.write_bytes(os.urandom(128))
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
        pid_file = Path("/run/munge/munged.pid")
        _wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip(), "munged")
        self.pids.append(int(pid_file.read_text()))

    def _start_daemon(self, args: list[str], pid_file: Path) -> None:
        subprocess.run(args, check=True, env=self.env)
        _wait_for(lambda: pid_file.is_file() and pid_file.read_text().strip(), args[0])
        self.pids.append(int(pid_file.read_text()))

    def start(self) -> None:
        ensure_installed()
        hosts = Path("/etc/hosts")
        if not any(line.split()[1:3] == ["n1", "n2"] for line in
                   hosts.read_text().splitlines() if line.strip()):
            with open(hosts, "a") as handle:
                handle.write("127.0.0.1 n1 n2\n")
        self.write_config()
        self._start_munge()
        self._start_daemon(["/usr/sbin/slurmctld", "-f", str(self.conf)],
                           self.root / "slurmctld.pid")
        for name in NODE_PORTS:
            self._start_daemon(["/usr/sbin/slurmd", "-f", str(self.conf), "-N", name],
                               self.root / f"slurmd-{name}.pid")
        _wait_for(self._idle, "both nodes idle", timeout=30)

    def _idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             env=self.env).stdout.split()
        return out == ["idle"]

    def stop(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                continue
            _wait_for(lambda: not Path(f"/proc/{pid}").exists(), f"pid {pid} to stop")
        self.pids.clear()
