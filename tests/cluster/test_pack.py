"""`hpctrain pack` and `dataset: the tests that start several processes or a server (torchrun,
Slurm, PostgreSQL, the browser, the model hub) (the others are tests/unit/test_pack.py,
tests/runs/test_pack.py)."""

import json
import subprocess
import tarfile
from pathlib import Path


from hpctrain.data.images.image_folders import scan_image_folder
from hpctrain.data.images.image_pack import Pack, ShardReader
from image_packs import packed


def test_shards_are_standard_tars_whose_index_points_at_the_original_bytes(image_folder,
                                                                          packed):
    manifest = json.loads((packed / "pack.json").read_text())
    assert manifest["classes"] == ["cat", "dog"]
    assert manifest["splits"]["train"]["samples"] == 24
    assert manifest["splits"]["val"]["per_class"] == [4, 4]
    train = Pack(packed).split("train")
    assert len(train.shards) > 2
    listing = subprocess.run(["tar", "-tf", str(train.shards[0])], capture_output=True,
                             text=True, check=True).stdout.split()
    assert listing[0].endswith(".jpg") and listing[1] == listing[0].replace(".jpg", ".cls")
    originals = {p.read_bytes(): label for p, label in
                 ((Path(p), label) for p, label in scan_image_folder(image_folder / "train")[1])}
    reader = ShardReader(train.shards)
    seen = [(bytes(reader.read(r)), int(r["label"])) for r in train.index]
    assert dict(seen) == originals  # every image once, unchanged, with its label
    with tarfile.open(train.shards[0]) as tar:  # what a plain tar reader (or WebDataset) sees
        first = tar.getmembers()[:2]
        data, label = (tar.extractfile(m).read() for m in first)
        assert originals[data] == int(label)
