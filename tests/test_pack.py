"""`hpctrain pack` and `dataset: shards`: the tar shards, the index, resuming, integrity
checks, and reading samples back exactly."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import write_image_folder
from hpctrain.config import AugmentConfig
from hpctrain.data.images.image_folders import ImageFolderDataset, scan_image_folder
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.sampling import SampleKey
from hpctrain.data.images.image_pack_dataset import ShardDataset, dct_reduction, decode_jpeg
from hpctrain.data.images.shapes import ensure_shapes
from hpctrain.data.images.image_pack import KIND_RAW, Pack, ShardReader
from hpctrain.errors import DataError

SMALL_SHARDS = PackOptions(shard_bytes=4000)  # several shards from a few small images


def quiet(*_):
    pass


@pytest.fixture
def packed(image_folder, tmp_path) -> Path:
    dst = tmp_path / "packed"
    pack(image_folder, dst, SMALL_SHARDS, workers=2, log=quiet)
    return dst


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


def test_training_crops_decode_large_jpegs_at_reduced_scale(tmp_path):
    source = tmp_path / "big"
    write_image_folder(source, classes=("a",), per_class=2, size=400)
    pack(source, tmp_path / "p", PackOptions(), workers=1, log=quiet)
    split = Pack(tmp_path / "p").split("train")
    assert dct_reduction((0, 0, 400, 404), 32) == 8 and dct_reduction((0, 0, 100, 90), 32) == 2
    dataset = ShardDataset(split, None, True, AugmentConfig(crop_scale=(0.9, 1.0)), 0)
    image, _ = dataset[SampleKey(0, 3, 32)]
    assert image.shape == (32, 32, 3) and image.dtype.is_floating_point is False


def test_pre_resized_raw_samples_hold_the_resized_pixels(image_folder, tmp_path):
    dst = tmp_path / "raw"
    pack(image_folder, dst, PackOptions(max_side=12, store="raw"), workers=1, log=quiet)
    split = Pack(dst).split("train")
    record = split.index[0]
    assert (int(record["width"]), int(record["height"])) == (12, 10)
    assert int(record["kind"]) == 1
    dataset = ShardDataset(split, None, False, AugmentConfig(), 0)
    image, _ = dataset[SampleKey(0, 0, 10)]
    assert image.shape == (10, 10, 3)


def test_a_list_file_source_with_class_names(tmp_path):
    folder = write_image_folder(tmp_path / "imgs", classes=("x", "y"), per_class=2)
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\n" + "".join(
        f"imgs/{c}/{i}.jpg,{c}\n" for c in ("y", "x") for i in range(2)))
    manifest = pack(listing, tmp_path / "p", PackOptions(), workers=1, log=quiet)
    assert manifest["classes"] == ["x", "y"] and manifest["splits"]["train"]["samples"] == 4
    assert folder.exists()


def test_unreadable_images_are_skipped_and_named_or_abort_with_strict(image_folder, tmp_path):
    bad = image_folder / "train" / "cat" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    manifest = pack(image_folder, tmp_path / "p", PackOptions(), workers=1, log=quiet)
    assert manifest["splits"]["train"]["samples"] == 24
    assert [s[0] for s in manifest["splits"]["train"]["skipped"]] == [str(bad)]
    with pytest.raises(DataError, match=f"unreadable source image {bad}"):
        pack(image_folder, tmp_path / "q", PackOptions(), workers=1, strict=True, log=quiet)


@pytest.mark.parametrize("options", [PackOptions(), PackOptions(store="auto", raw_fraction=0.5),
                                     PackOptions(max_side=16)])
def test_a_truncated_jpeg_is_skipped_at_packing_whichever_way_it_is_stored(image_folder,
                                                                          tmp_path, options):
    """A JPEG kept as it is decodes at an eighth of its size: its coded blocks are still all
    read, so one cut short is found as a fully decoded one is."""
    whole = image_folder / "train" / "cat" / "whole.jpg"
    Image.new("RGB", (256, 192), (200, 30, 90)).save(whole, quality=90)
    cut = whole.with_name("cut.jpg")
    cut.write_bytes(whole.read_bytes()[:-200])
    manifest = pack(image_folder, tmp_path / "p", options, workers=1, log=quiet)
    assert [s[0] for s in manifest["splits"]["train"]["skipped"]] == [str(cut)]
    assert manifest["splits"]["train"]["samples"] == 25


def test_an_interrupted_pack_resumes_without_rewriting_finished_shards(image_folder, tmp_path):
    victim = sorted((image_folder / "train" / "dog").iterdir())[-1]
    good = victim.read_bytes()
    victim.write_bytes(b"garbage")
    dst = tmp_path / "p"
    with pytest.raises(DataError):
        pack(image_folder, dst, SMALL_SHARDS, workers=1, strict=True, log=quiet)
    assert not (dst / "pack.json").exists()
    finished = {p.name: p.stat().st_mtime_ns for p in dst.glob("*.tar")}
    assert finished, "some shards should have been written before the failure"
    with pytest.raises(DataError, match="unfinished pack"):
        Pack(dst)
    victim.write_bytes(good)
    said = []
    pack(image_folder, dst, SMALL_SHARDS, workers=1, strict=True, log=said.append)
    assert f"{len(finished)} of " in said[0]
    assert all(dst.joinpath(n).stat().st_mtime_ns == t for n, t in finished.items())
    assert Pack(dst).split("train").index.shape == (24,)
    assert not list(dst.glob(".*"))  # no fragments or plan left behind


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


def test_images_are_in_rgb_whatever_the_source_mode(tmp_path):
    source = tmp_path / "modes" / "only"
    source.mkdir(parents=True)
    Image.fromarray(np.full((9, 9), 200, np.uint8)).save(source / "gray.jpg")
    Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(source / "png.png")
    pack(source.parent, tmp_path / "p", PackOptions(), workers=1, log=quiet)
    split = Pack(tmp_path / "p").split("train")
    dataset = ShardDataset(split, None, False, AugmentConfig(), 0)
    assert {dataset[SampleKey(i, 0, 9)][0].shape for i in range(2)} == {(9, 9, 3)}


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


def test_pack_options_are_checked(image_folder, tmp_path, run_cli):
    code, _, err = run_cli("pack", str(image_folder), str(tmp_path / "p"), "--shard-size", "x")
    assert code == 2 and "--shard-size 'x'" in err
    code, _, err = run_cli("pack", str(tmp_path / "nowhere"), str(tmp_path / "p"))
    assert code == 2 and "does not exist" in err


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0x01]))


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


def test_verify_checks_a_token_pack_whole_and_refuses_what_is_no_pack(tmp_path, run_cli):
    from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("the quick brown fox " * 200)
    pack_tokens(tmp_path / "src", tmp_path / "tokens", TokenPackOptions(), workers=1,
                log=quiet)
    assert run_cli("pack", "--verify", str(tmp_path / "tokens"))[0] == 0
    shard = next((tmp_path / "tokens").glob("*.bin"))
    _flip(shard, 100)
    code, out, _ = run_cli("pack", "--verify", str(tmp_path / "tokens"))
    assert code == 2 and f"{shard.name}: SHA-256 differs" in out
    code, _, err = run_cli("pack", "--verify", str(tmp_path / "src"))
    assert code == 2 and "no readable pack.json" in err
    code, _, err = run_cli("pack", "--verify", str(tmp_path / "tokens"), "a", "b")
    assert code == 2 and "give no SRC DST" in err


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


def test_pack_without_source_and_destination_is_exit_2(run_cli, tmp_path):
    code, _, err = run_cli("pack", str(tmp_path))
    assert code == 2 and "give the source and the pack folder" in err and "--verify" in err


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
