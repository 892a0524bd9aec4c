"""A real, throw-away Slurm cluster on this machine for the `slurm` tests.

Emulated nodes (by default n1, n2: one slurmd daemon each on this host) with 4 fake GPUs each
(character devices; no CUDA behind them, so training falls back to CPU and gloo). With
`accounting=True` a private MariaDB server and slurmdbd keep job accounting, so `sacct`
works. Everything lives in a temporary folder and is found through SLURM_CONF, so no system
configuration is touched except an /etc/hosts line that lets the node names resolve. Only
the daemons started here are stopped, by PID. Needs root (slurmd launches the jobs);
installs Debian's packages if they are missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from debian import ensure_installed

PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
            "munged": "munge"}
ACCOUNTING_PACKAGES = {"slurmdbd": "slurmdbd", "mariadbd": "mariadb-server"}


def _wait_for(check, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child (mariadbd)
    except ChildProcessError:
        pass
    return not Path(f"/proc/{pid}").exists()


def _make_resolvable(names: list[str]) -> None:
    """torch.distributed's rendezvous address is the first node's name: it must resolve."""
    unresolved = []
    for name in names:
        try:
            socket.gethostbyname(name)
        except OSError:
            unresolved.append(name)
    if unresolved:
        with open("/etc/hosts", "a") as hosts:
            hosts.write(f"127.0.0.1 {' '.join(unresolved)}\n")


def python_processes(marker: str) -> list[Path]:
    """The /proc entries of the python processes whose command line holds `marker` (a job's
    run, found by its run name to signal it as a node's failure would)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in command and b"python" in command.split(b"\0")[0]:
            found.append(proc)
    return found


class LocalSlurm:
    """Ports: slurmctld `port`, slurmdbd port+1, MariaDB port+2, the nodes' slurmd port+10+i,
    so two clusters with different `port` and `name` can run side by side."""

    def __init__(self, root: Path, name: str = "hpctraintest", nodes: tuple = ("n1", "n2"),
                 port: int = 16817, accounting: bool = False, preemption: bool = False):
        self.root, self.name, self.port, self.accounting = root, name, port, accounting
        self.preemption = preemption
        self.node_ports = {node: port + 10 + i for i, node in enumerate(nodes)}
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
            f"RealMemory=8000 Gres=gpu:4 State=UNKNOWN" for name, port in self.node_ports.items())
        node_list = ",".join(self.node_ports)
        r = self.root
        # preemption: jobs of partition 'urgent' requeue those of the default partition, as
        # PreemptMode=REQUEUE sites do; KillWait is Slurm's default (the grace a save has),
        # and a requeued job may start again after 10 s instead of cred_expire's 120; the
        # default partition keeps it too: a stop during start-up ends once torch is imported
        # and the run built (6 s on a 2-core CI machine, past a KillWait of 5). A job that
        # becomes eligible without an event (a requeued one once cred_expire has passed) waits
        # for the next scheduling pass: every 1-2 s here, not backfill's 30 s and the main
        # loop's 60 s by default (15 s of the preemption test)
        partitions = (f"PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE "
                      "State=UP PriorityTier=1\n"
                      f"PartitionName=urgent Nodes={node_list} MaxTime=INFINITE State=UP "
                      "PriorityTier=2 PreemptMode=OFF\n"
                      "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n"
                      "KillWait=30\nAuthInfo=cred_expire=10"
                      if self.preemption else
                      f"PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE "
                      "State=UP\nKillWait=30")
        accounting = (f"AccountingStorageType=accounting_storage/slurmdbd\n"
                      f"AccountingStorageHost=localhost\nAccountingStoragePort={self.port + 1}"
                      if self.accounting else "AccountingStorageType=accounting_storage/none")
        self.conf.write_text(f"""ClusterName={self.name}
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort={self.port}
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
SchedulerParameters=bf_interval=1,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ReturnToService=2
MinJobAge=300
InactiveLimit=0
JobCompType=jobcomp/none
{accounting}
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
{nodes}
{partitions}
""")
        (self.root / "gres.conf").write_text(
            f"NodeName={node_list} Name=gpu File={r}/dev/fakegpu[0-3]\n")
        if self.accounting:
            dbd = self.root / "slurmdbd.conf"  # found beside slurm.conf; must be private
            dbd.write_text(f"""AuthType=auth/munge
DbdHost=localhost
DbdPort={self.port + 1}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.port + 2}
StorageUser=root
StorageLoc=slurm_{self.name}
PidFile={r}/slurmdbd.pid
LogFile={r}/log/slurmdbd.log
""")
            dbd.chmod(0o600)

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

    def _start_accounting(self) -> None:
        """A private MariaDB (root without password, TCP on 127.0.0.1 only), then slurmdbd,
        then this cluster registered in it."""
        data = self.root / "mariadb"
        subprocess.run(["mariadb-install-db", "--user=root", f"--datadir={data}",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True)
        server = subprocess.Popen(
            ["/usr/sbin/mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
             f"--socket={self.root}/mariadb.sock", f"--port={self.port + 2}",
             "--bind-address=127.0.0.1", "--skip-name-resolve",
             f"--log-error={self.root}/log/mariadb.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.pids.append(server.pid)
        _wait_for(lambda: _listening(self.port + 2), "mariadbd")
        self._start_daemon(["/usr/sbin/slurmdbd"], self.root / "slurmdbd.pid")
        _wait_for(lambda: _listening(self.port + 1), "slurmdbd")
        subprocess.run(["sacctmgr", "-i", "add", "cluster", self.name], check=True,
                       env=self.env, capture_output=True)

    def start(self) -> None:
        ensure_installed({**PACKAGES, **(ACCOUNTING_PACKAGES if self.accounting else {})})
        _make_resolvable(list(self.node_ports))
        self.write_config()
        self._start_munge()
        if self.accounting:
            self._start_accounting()
        self._start_controller()
        for name in self.node_ports:
            self._start_daemon(["/usr/sbin/slurmd", "-f", str(self.conf), "-N", name],
                               self.root / f"slurmd-{name}.pid")
        _wait_for(self._idle, "all nodes idle", timeout=30)

    def _start_controller(self, *options: str) -> None:
        self._start_daemon(["/usr/sbin/slurmctld", *options, "-f", str(self.conf)],
                           self.root / "slurmctld.pid")

    def forget_jobs(self) -> None:
        """Restart the controller with its job state cleared: what happens to a finished job
        once MinJobAge has passed, or after the controller lost its state. (Accounting, if
        any, keeps the jobs.) Only between tests: running jobs are lost too."""
        pid_file = self.root / "slurmctld.pid"
        old = int(pid_file.read_text())
        self.pids.remove(old)
        # SIGTERM, not SIGKILL: the orderly stop (2.7 s) first sends accounting what it holds;
        # killed, a finished job's last record was lost and sacct showed it CANCELLED
        os.kill(old, 15)
        _wait_for(lambda: not Path(f"/proc/{old}").exists(), "slurmctld to stop")
        pid_file.unlink(missing_ok=True)
        self._start_controller("-c")
        _wait_for(self._idle, "all nodes idle again", timeout=30)

    def _idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             env=self.env).stdout.split()
        return out == ["idle"]

    def stop(self) -> None:
        """Every daemon told at once, then waited for: each takes about 2 s to go, which one
        after the other was 7 s a cluster."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 15)
        for pid in self.pids:
            _wait_for(lambda: _gone(pid), f"pid {pid} to stop")
        self.pids.clear()
