"""Where a run keeps what torch compiled (train/compilation.py): its folder chosen, keyed,
given back when the run ends, and refused where torch could not lock it."""

import errno
import fcntl
import os
from contextlib import ExitStack

import torch

from hpctrain.train import compilation


def test_the_run_s_folder_is_torch_s_until_the_run_ends(tmp_path, monkeypatch):
    monkeypatch.delenv(compilation.CACHE_VARIABLE, raising=False)
    monkeypatch.setattr(compilation, "YOURS", None)
    with ExitStack() as held:
        said = compilation.keep_cache("run", tmp_path, torch.device("cpu"), held)
        folder = tmp_path / "compile-cache" / compilation.cache_key(torch.device("cpu"))
        assert os.environ[compilation.CACHE_VARIABLE] == str(folder) and folder.is_dir()
        assert said == f"kept in {folder} (empty: compiled in this job, loaded by the next)"
        (folder / "kernel.so").write_bytes(b"")
        assert "1 files from earlier jobs" in compilation.keep_cache(
            "run", tmp_path, torch.device("cpu"), ExitStack())
    assert compilation.CACHE_VARIABLE not in os.environ  # as it was before the run


def test_a_shared_folder_holds_one_subfolder_per_machine_and_version(tmp_path, monkeypatch):
    monkeypatch.setattr(compilation, "YOURS", None)
    with ExitStack() as held:
        compilation.keep_cache(str(tmp_path / "shared"), tmp_path / "run", torch.device("cpu"),
                               held)
    key = compilation.cache_key(torch.device("cpu"))
    assert [p.name for p in (tmp_path / "shared").iterdir()] == [key]
    assert key.startswith(f"torch{torch.__version__.split('+')[0]}") and "/" not in key
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert compilation.cache_key(torch.device("cpu")) != key


def test_your_own_variable_and_none_are_left_to_torch(tmp_path, monkeypatch):
    """Your TORCHINDUCTOR_CACHE_DIR is kept, torch's default left set by a process that
    compiled before this one started it is not yours; `none` leaves torch's."""
    monkeypatch.setattr(compilation, "YOURS", "/scratch/mine")
    assert compilation.keep_cache("run", tmp_path, torch.device("cpu"), ExitStack()) == \
        "kept in /scratch/mine (your TORCHINDUCTOR_CACHE_DIR, which compile_cache=run leaves be)"
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setattr(compilation, "YOURS", default_cache_dir())  # a compiling parent's
    with ExitStack() as held:
        assert compilation.keep_cache("run", tmp_path, torch.device("cpu"), held).startswith(
            f"kept in {tmp_path / 'compile-cache'}")
    monkeypatch.setattr(compilation, "YOURS", None)
    assert "a job on another node compiles again" in compilation.keep_cache(
        "none", tmp_path / "elsewhere", torch.device("cpu"), ExitStack())
    assert not (tmp_path / "elsewhere" / "compile-cache").exists()


def test_a_folder_that_takes_no_lock_is_said_and_left(tmp_path, monkeypatch):
    """Lustre mounted without flock answers ENOSYS: torch's compiler would fail at its first
    lock, so the run leaves the cache where torch keeps it (flock itself is stood in for:
    no such file system here)."""
    monkeypatch.setattr(compilation, "YOURS", None)
    monkeypatch.delenv(compilation.CACHE_VARIABLE, raising=False)

    def no_locks(handle, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    said = compilation.keep_cache("run", tmp_path, torch.device("cpu"), ExitStack())
    assert said.startswith("kept where torch keeps them: ") and \
        "cannot hold them (Function not implemented)" in said
    assert compilation.CACHE_VARIABLE not in os.environ


def test_nothing_is_counted_before_torch_s_compiler_is_loaded(monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "torch._dynamo.utils", raising=False)
    assert compilation.tally() == dict.fromkeys(compilation.TALLIED, 0.0)
