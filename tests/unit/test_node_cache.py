"""data.images.cache: a verified node-local copy of a pack, made once and reused while valid.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_node_cache.py."""

from pathlib import Path

import pytest

from hpctrain.data import node_cache
from hpctrain.cluster.environment import node_local_scratch
from hpctrain.data.node_cache import CACHE_FOLDER, node_local_pack
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.images.image_pack import Pack
from hpctrain.errors import DataError


@pytest.fixture
def packed(image_folder, tmp_path) -> Pack:
    pack(image_folder, tmp_path / "shared" / "packed", PackOptions(shard_bytes=4000), workers=1,
         log=lambda *_: None)
    return Pack(tmp_path / "shared" / "packed")


def tree(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def test_the_copy_is_verified_reused_and_replaced_when_damaged(packed, tmp_path, capsys):
    local = tmp_path / "node-local"
    cached = node_local_pack(packed, str(local))
    assert cached.root == local / CACHE_FOLDER / packed.pack_id
    copied = tree(cached.root)
    assert {k: v for k, v in copied.items() if k != ".verified"} == tree(packed.root)
    assert "copying" in capsys.readouterr().err
    assert node_local_pack(packed, str(local)).root == cached.root
    assert "reusing the node-local copy" in capsys.readouterr().err
    shard = cached.split("train").shards[0]
    shard.write_bytes(shard.read_bytes()[:-100])  # the node's disk lost the end of a shard
    again = node_local_pack(packed, str(local))
    assert "no longer matches" in capsys.readouterr().err
    assert tree(again.root) == copied
    assert [p.name for p in (local / CACHE_FOLDER).iterdir()] == [packed.pack_id]


def test_a_corrupt_source_is_named_and_nothing_is_cached(packed, tmp_path):
    shard = packed.split("train").shards[1]
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"{shard.name} does not match its SHA-256"):
        node_local_pack(packed, str(tmp_path / "node-local"))
    assert list((tmp_path / "node-local" / CACHE_FOLDER).iterdir()) == []


def test_auto_uses_the_job_folder_and_steps_aside_when_there_is_none(packed, tmp_path,
                                                                     monkeypatch):
    monkeypatch.delenv("SLURM_TMPDIR", raising=False)
    monkeypatch.delenv("TMPDIR", raising=False)
    assert node_local_pack(packed, "auto", node_local_scratch()) is packed
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path / "job"))
    assert node_local_pack(packed, "auto", node_local_scratch()).root.parent == \
        tmp_path / "job" / CACHE_FOLDER
    monkeypatch.setenv("SLURM_TMPDIR", str(packed.root.parent))  # already node-local
    assert node_local_pack(packed, "auto", node_local_scratch()) is packed


def test_without_space_auto_reads_in_place_and_a_path_is_refused(packed, tmp_path,
                                                                 monkeypatch, capsys):
    """A full node-local disk cannot be made here: its free space is pretended."""
    monkeypatch.setattr(node_cache.shutil, "disk_usage", lambda path: type(
        "Usage", (), {"free": 1000})())
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path / "job"))
    assert node_local_pack(packed, "auto", node_local_scratch()) is packed
    assert "has 0.0 GB free; reading" in capsys.readouterr().err
    with pytest.raises(DataError, match="Free space there, choose another data.images.cache path"):
        node_local_pack(packed, str(tmp_path / "job"))
