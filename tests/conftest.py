"""Shared fixtures: tiny, fast configurations and small datasets built on disk."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import warm_starts
from hpctrain import cli
from hpctrain.config import load_config
from shipped_recipes import FIXTURES, console_script, summary_of, train_together, training

# The suite's own state and data folders (the job ledger, the output directories runs were
# written to, the runs index): the user's stay untouched, and every process the tests start
# (torchrun workers, Slurm jobs) inherits them.
_PRIVATE = Path(tempfile.mkdtemp(prefix="hpctrain-tests-"))
os.environ["XDG_STATE_HOME"] = str(_PRIVATE / "state")
os.environ["XDG_DATA_HOME"] = str(_PRIVATE / "data")


@pytest.fixture(scope="session", autouse=True)
def warm_hpctrain_starts():
    """Every `python -m hpctrain` a test starts is forked from a process that has imported
    it (warm_starts.py): 3 s sooner each, a few hundred times a session. HPCTRAIN_TESTS_COLD=1
    starts them all the usual way."""
    if os.environ.get("HPCTRAIN_TESTS_COLD") == "1":
        yield
        return
    warm_starts.install()
    yield
    warm_starts.uninstall()


@pytest.fixture(autouse=True)
def cold_start(request):
    """A test marked cold_start (one of start-up itself) starts fresh interpreters."""
    cold = request.node.get_closest_marker("cold_start") is not None
    warm_starts.WarmPopen.cold = cold
    yield
    warm_starts.WarmPopen.cold = False


@pytest.fixture(scope="session")
def shapes_cache(tmp_path_factory) -> Path:
    """One small shapes dataset for the whole session."""
    return tmp_path_factory.mktemp("shapes-cache")


@pytest.fixture(scope="session")
def default_shapes_cache(tmp_path_factory) -> Path:
    """The full-size shapes dataset of the default recipe, generated once for the session
    (or kept in HPCTRAIN_TEST_CACHE between sessions)."""
    kept = os.environ.get("HPCTRAIN_TEST_CACHE")
    return Path(kept) if kept else tmp_path_factory.mktemp("default-shapes")


def run_installed(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`hpctrain ARGS` through the installed console script, as a user runs it."""
    return subprocess.run([console_script(), *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def shipped_recipe_runs(request, tmp_path_factory, default_shapes_cache) -> dict[str, tuple]:
    """The shipped recipes' trainings that this session's tests use, trained together once
    (shipped_recipes.py): {recipe: (process, summary)}."""
    wanted = {recipe for name, recipe in FIXTURES.items()
              if any(name in item.fixturenames for item in request.session.items)}
    return train_together({recipe: training(recipe, tmp_path_factory.mktemp(f"{recipe}-run"),
                                            default_shapes_cache) for recipe in sorted(wanted)})


@pytest.fixture(scope="session")
def default_recipe_run(shipped_recipe_runs):
    """`hpctrain run` on the built-in default, once per session: (process, summary)."""
    return summary_of(shipped_recipe_runs["default"])


@pytest.fixture(scope="session")
def tiny_lm_recipe_run(shipped_recipe_runs):
    """`hpctrain run tiny-lm`, once per session: (process, summary)."""
    return summary_of(shipped_recipe_runs["tiny-lm"])


@pytest.fixture(scope="session")
def pointnet_recipe_run(shipped_recipe_runs):
    """`hpctrain run pointnet`, once per session: (process, summary)."""
    return summary_of(shipped_recipe_runs["pointnet"])


@pytest.fixture
def tiny(tmp_path, shapes_cache):
    """Overrides for a run of a few seconds: tiny net, 16 px, small shapes set."""
    def make(*extra: str) -> list[str]:
        return [
            f"output_dir={tmp_path / 'runs'}",
            f"data.shapes.cache_dir={shapes_cache}",
            "data.shapes.num_train=160", "data.shapes.num_val=40", "data.shapes.image_size=16",
            "data.images.image_size=16", "data.num_workers=0",
            "model.name=hpctrain:tiny_cnn", "train.batch_size=16", "train.epochs=1",
            "train.log_every=2", "tensorboard=false", "report=false", *extra,
        ]
    return make


@pytest.fixture
def tiny_config(tiny):
    def make(*extra: str):
        return load_config("default", tiny(*extra))
    return make


@pytest.fixture
def run_cli(capsys):
    """Call the CLI in-process: (exit code, stdout, stderr)."""
    def call(*args: str):
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err
    return call


@pytest.fixture(autouse=True)
def restore_torch_globals():
    """Runs change process-wide switches (determinism, TF32, seeds): put them back."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    benchmark = torch.backends.cudnn.benchmark
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    cudnn_attention = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def child_processes(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def running(pid: int) -> bool:
    """Process `pid` runs: it has not ended, nor is it a zombie its parent has yet to reap."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def loader_workers(pid: int) -> list[int]:
    """The loader workers of the run in process `pid`: its children that are neither
    multiprocessing's resource tracker nor its forkserver, and the forkserver's children (the
    workers it started, data.worker_start's default)."""
    workers = []
    for child in child_processes(pid):
        command = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"resource_tracker" in command:
            continue
        workers += child_processes(child) if b"forkserver" in command else [child]
    return workers


def write_image_folder(root: Path, classes=("cat", "dog"), per_class=6, size=20,
                       ext="jpg") -> Path:
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size + 4, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.{ext}")
    return root


@pytest.fixture
def image_folder(tmp_path) -> Path:
    """ROOT/train/<class> and ROOT/val/<class> with random images."""
    root = tmp_path / "images"
    write_image_folder(root / "train", per_class=12)
    write_image_folder(root / "val", per_class=4)
    return root


@pytest.fixture
def seeded():
    random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private job ledger (~/.local/state/hpctrain/jobs.jsonl) for the jobs a test submits."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home" / ".local" / "state"))
    return tmp_path / "home"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real two-node Slurm cluster for the session (see slurm_cluster.py); SLURM_CONF points
    the client commands at it."""
    from slurm_cluster import LocalSlurm

    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    previous = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        cluster.stop()
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the session (postgres_server.py): the team's runs index, a
    search's study. Its folder is not under pytest's basetemp: a second pytest started beside
    this one (the unit lane while the suite runs) sets /tmp/pytest-of-USER back to 0700, and
    the server, running as the postgres user, lost its own data folder (a PANIC, then every
    later test of the index refused)."""
    from postgres_server import LocalPostgres

    root = Path(tempfile.mkdtemp(prefix="hpctrain-tests-postgres-"))
    server = LocalPostgres(root / "server").start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _one_test_cluster(folder: Path, monkeypatch, **options):
    """A LocalSlurm beside the session's (other ports), for one test; SLURM_CONF points the
    client commands at it meanwhile."""
    from slurm_cluster import LocalSlurm

    cluster = LocalSlurm(folder, **options)
    try:
        cluster.start()
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm_accounting_cluster(tmp_path_factory, monkeypatch):
    """A one-node cluster with accounting (MariaDB + slurmdbd, so sacct answers)."""
    yield from _one_test_cluster(tmp_path_factory.mktemp("slurm-accounting"), monkeypatch,
                                 name="accounted", nodes=("a1",), port=16917, accounting=True)


@pytest.fixture
def slurm_preemption_cluster(tmp_path_factory, monkeypatch):
    """A two-node cluster whose partition 'urgent' preempts (and Slurm requeues) the jobs of
    the default partition, with Slurm's default KillWait of 30 s."""
    yield from _one_test_cluster(tmp_path_factory.mktemp("slurm-preemption"), monkeypatch,
                                 name="preempting", nodes=("p1", "p2"), port=17017,
                                 preemption=True)


@pytest.fixture
def fleet(tmp_path) -> Path:
    """Five runs whose usage and race the runs-index tests compute by hand (run_fleet.py)."""
    from run_fleet import write_fleet

    return write_fleet(tmp_path / "runs")


@pytest.fixture
def private_state(tmp_path, monkeypatch):
    """No output directories remembered but those a test names (other tests' runs stay out)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """A fresh, empty index: an SQLite file, or a new database on the session's server."""
    if request.param == "sqlite":
        return str(tmp_path / "index.sqlite")
    import psycopg

    server = request.getfixturevalue("postgres")
    name = f"t{os.getpid()}_{abs(hash(tmp_path)) % 10**8}"
    with psycopg.connect(server.url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return server.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def forget_user_modules(tmp_path):
    """Each test's files are fresh modules: undo the imports from tmp_path, and the sys.path
    entries, that it added."""
    path = list(sys.path)
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
    sys.path[:] = path


@pytest.fixture
def nvml(monkeypatch):
    """install(**options): the simulated NVML (fake_nvml.py) as pynvml, for this test."""
    from fake_nvml import fake_nvml

    def install(**options):
        module = fake_nvml(**options)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module
    return install
