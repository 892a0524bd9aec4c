"""`hpctrain pack` and `dataset: the tests that need no training run, no process and no server
(the others are tests/runs/test_pack.py, tests/cluster/test_pack.py)."""


import numpy as np
import pytest
from PIL import Image

from conftest import write_image_folder
from hpctrain.config import AugmentConfig
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.sampling import SampleKey
from hpctrain.data.images.image_pack_dataset import ShardDataset, dct_reduction
from hpctrain.data.images.image_pack import Pack
from hpctrain.errors import DataError
from image_packs import SMALL_SHARDS, _flip, quiet


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


def test_links_planted_in_an_unfinished_pack_receive_nothing(image_folder, tmp_path):
    """Before, a shard, an index and the manifest were written under fixed names
    (.NAME.partial) opened without care: a link planted there by whoever could write in the
    pack's folder took the pack's bytes into any file of the user packing it."""
    broken = sorted((image_folder / "train" / "dog").iterdir())[-1]
    good = broken.read_bytes()
    broken.write_bytes(b"garbage")
    dst = tmp_path / "p"
    with pytest.raises(DataError):
        pack(image_folder, dst, SMALL_SHARDS, workers=1, strict=True, log=quiet)
    broken.write_bytes(good)
    precious = tmp_path / "precious.txt"
    precious.write_text("precious")
    names = [f"train-{n:05d}.tar" for n in range(8)] + [f"val-{n:05d}.tar" for n in range(8)] \
        + ["pack.json", "train.index.npy", "val.index.npy"]
    for name in names:
        if not (dst / name).exists():
            (dst / f".{name}.partial").symlink_to(precious)
    pack(image_folder, dst, SMALL_SHARDS, workers=1, strict=True, log=quiet)
    assert precious.read_text() == "precious"
    assert Pack(dst).split("train").index.shape == (24,)
    assert not list(dst.glob(".*"))  # the planted links taken away with the leftovers


def test_images_are_in_rgb_whatever_the_source_mode(tmp_path):
    source = tmp_path / "modes" / "only"
    source.mkdir(parents=True)
    Image.fromarray(np.full((9, 9), 200, np.uint8)).save(source / "gray.jpg")
    Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(source / "png.png")
    pack(source.parent, tmp_path / "p", PackOptions(), workers=1, log=quiet)
    split = Pack(tmp_path / "p").split("train")
    dataset = ShardDataset(split, None, False, AugmentConfig(), 0)
    assert {dataset[SampleKey(i, 0, 9)][0].shape for i in range(2)} == {(9, 9, 3)}


def test_pack_options_are_checked(image_folder, tmp_path, run_cli):
    code, _, err = run_cli("pack", str(image_folder), str(tmp_path / "p"), "--shard-size", "x")
    assert code == 2 and "--shard-size 'x'" in err
    code, _, err = run_cli("pack", str(tmp_path / "nowhere"), str(tmp_path / "p"))
    assert code == 2 and "does not exist" in err


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
    assert code == 2 and "pack.json is missing; give pack --verify a pack folder made by" in err
    code, _, err = run_cli("pack", "--verify", str(tmp_path / "tokens"), "a", "b")
    assert code == 2 and "give no SRC DST" in err


def test_pack_without_source_and_destination_is_exit_2(run_cli, tmp_path):
    code, _, err = run_cli("pack", str(tmp_path))
    assert code == 2 and "give the source and the pack folder" in err and "--verify" in err
