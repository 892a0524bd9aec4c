"""A real, throw-away PostgreSQL server for the runs-index tests: Debian's postgresql package
(installed when missing), a cluster made with initdb in a temporary folder, listening on a
free localhost port with trust authentication. As root the server runs as the `postgres`
user (PostgreSQL refuses root). Only the postmaster started here is stopped, by its PID.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from debian import ensure_installed


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    if shutil.which(name):
        return shutil.which(name)
    raise FileNotFoundError(name)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalPostgres:
    def __init__(self, root: Path, max_connections: int = 50):
        self.root, self.max_connections = root, max_connections
        self.data = root / "data"
        self.port = _free_port()
        self.pid: int | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_owner(self, args: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return args
        return ["runuser", "-u", "postgres", "--", *args]

    def start(self) -> LocalPostgres:
        ensure_installed({"pg_ctlcluster": "postgresql"})
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            self.root.chmod(0o755)
            for parent in self.root.parents:  # the postgres user must reach its folder
                if parent == Path("/tmp") or parent == Path("/"):
                    break
                parent.chmod(parent.stat().st_mode | 0o711)
        subprocess.run(self._as_owner([_bin("initdb"), "-D", str(self.data), "-U", "postgres",
                                       "--auth=trust", "--no-sync", "-E", "UTF8"]),
                       check=True, capture_output=True, timeout=120)
        log = self.root / "postgres.log"
        subprocess.run(self._as_owner([
            _bin("pg_ctl"), "-D", str(self.data), "-l", str(log), "-w", "-t", "60", "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            f"-c max_connections={self.max_connections}", "start"]), check=True,
            capture_output=True, timeout=90)
        self.pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        return self

    def stop(self) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGINT)  # fast shutdown
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pid = None
