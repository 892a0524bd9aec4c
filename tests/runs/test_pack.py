"""`hpctrain pack` and `dataset: shards`: the tar shards, the index, resuming, integrity
checks, and reading samples back exactly.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_pack.py, tests/cluster/test_pack.py."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import write_image_folder
from hpctrain.config import AugmentConfig
from hpctrain.data.images.image_folders import ImageFolderDataset, scan_image_folder
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.sampling import SampleKey
from hpctrain.data.images.image_pack_dataset import ShardDataset, decode_jpeg
from hpctrain.data.images.shapes import ensure_shapes
from hpctrain.data.images.image_pack import KIND_RAW, Pack, ShardReader
from hpctrain.errors import DataError
from image_packs import _flip, packed, quiet


def test_validation_samples_match_the_image_folder_pixel_for_pixel(image_folder, packed):
    augment = AugmentConfig()
    folder = ImageFolderDataset(scan_image_folder(image_folder / "val")[1], False, augment, 0)
    by_bytes = {Path(p).read_bytes(): i for i, (p, _) in enumerate(folder.samples)}
    split = Pack(packed).split("val")
    shards = ShardDataset(split, None, False, augment, 0)
    reader = ShardReader(split.shards)
    for position in range(len(shards)):
        twin = by_bytes[bytes(reader.read(split.index[position]))]
        ours, label = shards[SampleKey(position, 0, 16)]
        theirs, their_label = folder[SampleKey(twin, 0, 16)]
        assert label == their_label and ours.equal(theirs)


def test_a_raw_jpeg_mix_renders_the_same_views_as_an_all_jpeg_pack(image_folder, packed,
                                                                  tmp_path):
    """Raw samples hold exactly the decoded pixels, so a mix changes speed, not data; and the
    two JPEG decoders (simplejpeg, PIL) agree to the pixel."""
    mixed = tmp_path / "mixed"
    pack(image_folder, mixed, PackOptions(store="auto", raw_max_side=0, raw_fraction=0.5),
         workers=1, log=quiet)
    split, jpeg_split = Pack(mixed).split("train"), Pack(packed).split("train")
    assert 0 < int((split.index["kind"] == KIND_RAW).sum()) < len(split.index)
    reader = ShardReader(jpeg_split.shards)
    for record in jpeg_split.index[:4]:
        size = int(record["width"]), int(record["height"])
        decoded = [decode_jpeg(reader.read(record), *size, decoder=name)
                   for name in ("simplejpeg", "pil")]
        assert all(np.array_equal(decoded[0], other) for other in decoded[1:])
    augment = AugmentConfig()
    ours = ShardDataset(split, None, True, augment, 0)
    theirs = ShardDataset(jpeg_split, None, True, augment, 0)
    for position in range(len(ours)):  # the same seeded order in both packs
        (image, label), (twin, twin_label) = ours[SampleKey(position, 1, 12)], \
            theirs[SampleKey(position, 1, 12)]
        assert label == twin_label and image.equal(twin)


def test_packing_into_a_non_empty_folder_needs_overwrite(image_folder, packed, tmp_path,
                                                         run_cli):
    code, _, err = run_cli("pack", str(image_folder), str(packed))
    assert code == 2 and "holds a finished pack" in err and "--overwrite" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    code, _, err = run_cli("pack", str(image_folder), str(other))
    assert code == 2 and "holds other files" in err and (other / "notes.txt").exists()
    code, out, _ = run_cli("pack", str(image_folder), str(other), "--overwrite", "--workers",
                           "1")
    assert code == 0 and "train: 24 samples" in out and "cat 12, dog 12" in out
    assert not (other / "notes.txt").exists()


def test_a_truncated_shard_is_named_when_the_pack_is_opened(packed):
    shard = Pack(packed).split("train").shards[1]
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 700)
    with pytest.raises(DataError, match=f"shard {shard.name} has .* bytes.*truncated"):
        Pack(packed).split("train")


def test_a_corrupted_sample_fails_its_checksum_instead_of_decoding_wrong(packed):
    split = Pack(packed).split("train")
    record = split.index[0]
    shard = split.shards[int(record["shard"])]
    with open(shard, "r+b") as handle:
        handle.seek(int(record["offset"]) + 100)
        byte = handle.read(1)
        handle.seek(int(record["offset"]) + 100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    dataset = ShardDataset(Pack(packed).split("train"), None, False, AugmentConfig(), 0)
    with pytest.raises(DataError, match=f"shard .*{shard.name} is corrupted.*CRC-32"):
        dataset[SampleKey(0, 0, 16)]


def test_an_index_from_another_pack_or_a_missing_shard_is_refused(image_folder, packed,
                                                                  tmp_path):
    other = tmp_path / "other"
    pack(image_folder, other, PackOptions(max_side=8), workers=1, log=quiet)
    os.replace(other / "train.index.npy", packed / "train.index.npy")
    with pytest.raises(DataError, match="does not belong to this pack"):
        Pack(packed).split("train")
    Pack(packed).split("val").shards[0].unlink()
    with pytest.raises(DataError, match="shard val-00000.tar is missing"):
        Pack(packed).split("val")


def test_workers_map_the_shards_themselves(packed):
    """What DataLoader workers receive carries paths, not maps or data."""
    import pickle

    dataset = ShardDataset(Pack(packed).split("train"), None, True, AugmentConfig(), 0)
    dataset[SampleKey(0, 0, 16)]
    assert dataset.reader._maps and dataset._index is not None
    assert dataset.__getstate__()["_index"] is None
    reader = pickle.loads(pickle.dumps(dataset.reader))
    assert reader._maps == {} and len(pickle.dumps(dataset.reader)) < 2000
    record = dataset.record(3)
    assert bytes(reader.read(record)) == bytes(dataset.reader.read(record))


def test_a_run_trains_from_a_pack(packed, run_cli, tiny, tmp_path):
    code, _, err = run_cli("run", "default", *tiny("data.dataset=shards",
                                                   f"data.path={packed}", "run_name=sh"))
    assert code == 0, err
    summary = json.loads((tmp_path / "runs" / "sh" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 24 // 16
    assert summary["final_val_accuracy"] is not None


def test_training_from_an_ordered_pack_repeats_the_image_folder_run(tmp_path, run_cli, tiny,
                                                                    shapes_cache):
    """Same images in the same order and the same views: the same training, step by step."""
    folder = ensure_shapes(shapes_cache, 0, 160, 40, 16)
    pack(folder, tmp_path / "p", PackOptions(store="auto", shuffle=False), workers=1,
         log=quiet)
    losses = {}
    for name, source in (("folder", ["data.dataset=imagefolder", f"data.path={folder}"]),
                         ("pack", ["data.dataset=shards", f"data.path={tmp_path / 'p'}"])):
        code, _, err = run_cli("run", "default", *tiny(*source, f"run_name={name}",
                                                       "train.epochs=2", "data.num_workers=2"))
        assert code == 0, err
        rows = (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()
        losses[name] = [(r["step"], r.get("loss"), r.get("val_accuracy"))
                        for r in map(json.loads, rows)]
    assert len(losses["folder"]) > 4 and losses["pack"] == losses["folder"]


def test_a_pack_without_val_split_holds_out_a_fraction(tmp_path, run_cli, tiny):
    source = write_image_folder(tmp_path / "one", per_class=20)
    pack(source, tmp_path / "p", PackOptions(), workers=1, log=quiet)
    base = tiny("data.dataset=shards", f"data.path={tmp_path / 'p'}")
    code, _, err = run_cli("run", "default", *base)
    assert code == 2 and "has no val split; set data.val_fraction=0.1" in err
    code, _, err = run_cli("run", "default", *base, "data.val_fraction=0.2")
    assert code == 0, err


def test_a_label_count_that_disagrees_with_the_recipe_is_refused(packed, run_cli, tiny):
    code, _, err = run_cli("run", "default", *tiny("data.dataset=shards",
                                                   f"data.path={packed}",
                                                   "data.num_classes=1000"))
    assert code == 2 and "data.num_classes=1000, but the shards data" in err
    assert "has 2 classes" in err


def test_verify_names_every_damaged_shard_and_sample(packed, run_cli):
    code, out, _ = run_cli("pack", "--verify", str(packed))
    manifest = json.loads((packed / "pack.json").read_text())
    samples = sum(e["samples"] for e in manifest["splits"].values())
    assert code == 0 and "intact" in out and f"{samples:,} samples' CRC-32" in out
    split = Pack(packed).split("train")
    damaged = [0, 7]  # one bit flipped in each of two samples, and one in a tar header
    for sample in damaged:
        record = split.index[sample]
        _flip(split.shards[int(record["shard"])], int(record["offset"]) + 50)
    first = int(split.index[damaged[0]]["shard"])
    header_only = next(i for i in range(len(split.shards))
                       if i not in {int(split.index[s]["shard"]) for s in damaged})
    _flip(split.shards[header_only], 10)  # a member name: no sample's bytes
    (packed / Pack(packed).split("val").shards[0].name).unlink()
    code, out, err = run_cli("pack", "--verify", str(packed), "--json")
    assert code == 2, err
    report = json.loads(out)
    assert [s["sample"] for s in report["damaged_samples"]] == damaged
    assert report["damaged_samples"][0]["shard"] == split.shards[first].name
    files = report["damaged_files"]
    assert f"{split.shards[header_only].name}: SHA-256 differs from the manifest's" in files
    assert "val-00000.tar: missing" in files and len(files) == 2 + len({
        int(split.index[s]["shard"]) for s in damaged})
    code, out, _ = run_cli("pack", "--verify", str(packed))
    assert code == 2 and "train sample 7 (label" in out and "fail their CRC-32" in out


def test_verify_reads_no_file_that_links_out_of_the_pack(packed, tmp_path, run_cli):
    """A shard moved out and linked back holds the right bytes, but is not the pack's: named,
    not read, exit 2; a link inside the pack is the pack's own."""
    copy = Path(shutil.copytree(packed, tmp_path / "pack"))
    name = json.loads((copy / "pack.json").read_text())["splits"]["train"]["shards"][0]["file"]
    shutil.move(copy / name, tmp_path / "elsewhere.tar")
    (copy / name).symlink_to(tmp_path / "elsewhere.tar")
    code, out, _ = run_cli("pack", "--verify", str(copy), "--json")
    assert code == 2
    assert f"{name}: a link out of the pack (to {tmp_path / 'elsewhere.tar'}), not read" in \
        json.loads(out)["damaged_files"]
    shutil.move(tmp_path / "elsewhere.tar", copy / "kept.bin")
    (copy / name).unlink()
    (copy / name).symlink_to("kept.bin")
    assert run_cli("pack", "--verify", str(copy))[0] == 0


def test_packing_workers_block_no_signal_though_the_forkserver_was_started_blocking_some():
    """A run's loader with data.worker_start=forkserver starts the forkserver with the stop
    signals blocked, for its own workers, and the server's children inherit what it keeps
    blocked. A pack made later in the same process (a notebook, this suite) took its workers
    from that server: in the suite one kept SIGTERM blocked and Pool.terminate waited on it
    for good (test_pack's fixture stuck after test_user_code). Here the server keeps SIGUSR1,
    which the workers inherited before."""
    code = textwrap.dedent("""
        import functools, multiprocessing.forkserver, signal
        from hpctrain.data.packs import run_jobs
        from hpctrain.data.worker_signals import blocked
        with blocked(("SIGUSR1",)):
            multiprocessing.forkserver.ensure_running()
        masks = run_jobs(functools.partial(signal.pthread_sigmask, signal.SIG_BLOCK), [[], []], 2)
        print(sorted({signal.Signals(s).name for mask in masks for s in mask}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
