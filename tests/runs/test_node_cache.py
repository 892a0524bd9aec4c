"""data.images.cache: the tests that train, in this process or in an `hpctrain` process of their own
(the others are tests/unit/test_node_cache.py)."""

import json

import pytest

from hpctrain.data.node_cache import CACHE_FOLDER
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.images.image_pack import Pack


@pytest.fixture
def packed(image_folder, tmp_path) -> Pack:
    pack(image_folder, tmp_path / "shared" / "packed", PackOptions(shard_bytes=4000), workers=1,
         log=lambda *_: None)
    return Pack(tmp_path / "shared" / "packed")


def test_a_run_reads_the_cached_pack(packed, run_cli, tiny, tmp_path):
    code, _, err = run_cli("run", "default", *tiny(
        "data.dataset=shards", f"data.path={packed.root}",
        f"data.images.cache={tmp_path / 'local'}", "run_name=cached"))
    assert code == 0, err
    assert (tmp_path / "local" / CACHE_FOLDER / packed.pack_id / ".verified").is_file()
    summary = json.loads((tmp_path / "runs" / "cached" / "summary.json").read_text())
    assert summary["status"] == "completed"
    code, _, err = run_cli("run", "default", *tiny("data.images.cache=auto"))
    assert code == 2 and "data.images.cache=auto applies to dataset 'shards' only" in err
