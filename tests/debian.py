"""Installing the Debian packages a test needs (Slurm, MariaDB, PostgreSQL, Chromium) when
their program is missing: the suite brings its real components itself, as .ci/run does."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def ensure_installed(packages: dict[str, str]) -> None:
    """apt-get install the packages whose program (the key) is missing."""
    missing = [package for program, package in packages.items() if not shutil.which(program)
               and not Path("/usr/sbin", program).exists()]
    if not missing:
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"these tests need root to install {', '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                   check=True, env=env, stdout=subprocess.DEVNULL)
