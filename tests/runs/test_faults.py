"""Fault injection: a table of hostile and damaged inputs, each run through the command line
as a user (or an attacker) would, with the exit code it must end in and the words its message
must hold. After every row: no traceback, no payload ran (its marker file is absent), and a
file outside every place hpctrain may write (the victim) is as it was.

Every path a hostile input names points at the row's own victim, never at a file of the
machine: should a defence regress, the test must harm nothing but its own folder. (Run against
the code before issue 16, a row naming /etc/passwd as a pack's index truncated it.)

docs/reliability.md lists these promises and where each is tested.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import write_image_folder
from hostile import DAMAGE, plant_hostile_index, plant_hostile_value
from hpctrain import cli
from hpctrain.data.images.image_packing import PackOptions, pack
from warm_starts import AddressSpaceLimit


@dataclass
class World:
    """One row's scratch place: copies of a trained run and of a pack, a victim file that
    must survive, a marker that a payload would create."""

    tmp: Path
    shapes: Path
    trained: Path  # the session's run, copied on demand
    packed: Path  # the session's pack, copied on demand
    mounts: list[Path] = field(default_factory=list)

    def __post_init__(self):
        self.victim = self.tmp / "victim" / "precious.txt"
        self.victim.parent.mkdir(parents=True)
        self.victim.write_text("precious")
        self.marker = self.tmp / "pwned"

    def tiny(self, *extra: str) -> list[str]:
        return [f"output_dir={self.tmp / 'runs'}", f"data.shapes.cache_dir={self.shapes}",
                "data.shapes.num_train=160", "data.shapes.num_val=40",
                "data.shapes.image_size=16", "data.images.image_size=16", "data.num_workers=0",
                "model.name=hpctrain:tiny_cnn", "train.batch_size=16", "train.max_steps=2",
                "tensorboard=false", *extra]

    def run_copy(self) -> Path:
        """The trained run (checkpoints step 2 and 4) as runs/trained."""
        return Path(shutil.copytree(self.trained, self.tmp / "runs" / "trained"))

    def resume(self, *extra: str) -> list[str]:
        return ["run", "default", *self.tiny("run_name=trained", "resume=auto",
                                             "train.max_steps=6", *extra)]

    def pack_copy(self) -> Path:
        return Path(shutil.copytree(self.packed, self.tmp / "pack"))

    def train_on(self, pack: Path) -> list[str]:
        return ["run", "default", *self.tiny("data.dataset=shards", f"data.path={pack}",
                                             f"data.images.cache={self.tmp / 'cache'}")]

    def mount(self, name: str, options: str) -> Path:
        """A real file system of its own (tmpfs, needs root), unmounted after the row."""
        point = self.tmp / name
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                       check=True)
        self.mounts.append(point)
        return point


@dataclass
class Fault:
    name: str
    make: Callable[[World], list[str]]  # builds the input, returns the command's arguments
    code: int
    words: tuple[str, ...]
    after: Callable[[World], None] | None = None  # more that must hold afterwards
    isolate: bool = False  # might hang or exhaust memory if the defence broke: a subprocess


# ---- inputs -------------------------------------------------------------------------------

def _checkpoint(world: World, step: int = 4) -> Path:
    return world.run_copy() / "checkpoints" / f"step_{step:08d}"


def checkpoint_made(spoil: Callable[[Path, World], None], asked_for: bool = True):
    """The trained run with its newest checkpoint spoiled; resumed from that checkpoint by
    name, or with resume=auto (which then falls back to the one before)."""
    def make(world):
        checkpoint = _checkpoint(world)
        spoil(checkpoint, world)
        return world.resume(*([f"resume={checkpoint}"] if asked_for else []))
    return make


def _index_naming_outside(checkpoint: Path, world: World) -> None:
    index = pickle.loads((checkpoint / ".metadata").read_bytes())
    for where in index.storage_data.values():
        where.relative_path = os.path.relpath(world.victim, checkpoint)
    (checkpoint / ".metadata").write_bytes(pickle.dumps(index))


def all_damaged(world):
    run = world.run_copy()
    for checkpoint in (run / "checkpoints").glob("step_*"):
        DAMAGE["broken meta.json"][0](checkpoint)
    return world.resume()


def set_aside_with_a_warning(world):
    assert list((world.tmp / "runs" / "trained" / "checkpoints").glob(
        "set-aside-*/step_00000004/.metadata"))


def manifest(change: Callable[[dict, World], object]):
    """A pack whose pack.json is changed by `change` (which may return a replacement)."""
    def make(world):
        pack_dir = world.pack_copy()
        data = json.loads((pack_dir / "pack.json").read_text())
        data = change(data, world) or data
        (pack_dir / "pack.json").write_text(json.dumps(data))
        return world.train_on(pack_dir)
    return make


def _set(path: str, value):
    """Set one manifest entry; a callable value is given the world (to aim at its victim:
    should a defence ever fail, the test must harm nothing but its own files)."""
    def change(data, world):
        value_now = value(world) if callable(value) else value
        node = data
        *parents, last = path.split("/")
        for key in parents:
            node = node[int(key) if key.isdigit() else key]
        node[int(last) if last.isdigit() else last] = value_now
    return change


def index(change: Callable[[np.ndarray], np.ndarray | None], allow_pickle: bool = False):
    """A pack whose train index is changed, and re-hashed so that it belongs to the pack:
    what a crafted pack looks like."""
    def make(world):
        pack_dir = world.pack_copy()
        path = pack_dir / "train.index.npy"
        records = np.load(path).copy()
        records = change(records) if change(records.copy()) is not None else records
        change(records)
        with open(path, "wb") as handle:
            np.save(handle, records, allow_pickle=allow_pickle)
        data = json.loads((pack_dir / "pack.json").read_text())
        data["splits"]["train"]["index"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        (pack_dir / "pack.json").write_text(json.dumps(data))
        return world.train_on(pack_dir)
    return make


def _field(name: str, value):
    def change(records):
        records[name] = value
    return change


def _shift_range(records):
    records["offset"][0] = 10**9


def _wrapping_range(records):
    """offset + size passes 2**64 and wraps to 0: inside every shard, in uint64."""
    records["offset"][0], records["size"][0] = 2**64 - 2**32 + 1, 2**32 - 1


def a_shard_linking_out(world):
    """The pack's first shard moved out of the pack and linked back: the same bytes, read
    from a place the pack does not own."""
    pack_dir = world.pack_copy()
    name = json.loads((pack_dir / "pack.json").read_text())["splits"]["train"]["shards"][0][
        "file"]
    outside = world.tmp / "elsewhere.tar"
    shutil.move(pack_dir / name, outside)
    (pack_dir / name).symlink_to(outside)
    return world.train_on(pack_dir)


def _object_index(records):
    return np.array([{"not": "an index"}], dtype=object)


def csv_list(text: bytes):
    def make(world):
        (world.tmp / "list.csv").write_bytes(text)
        return ["pack", str(world.tmp / "list.csv"), str(world.tmp / "out")]
    return make


def recipe(text: bytes):
    def make(world):
        (world.tmp / "mine.yaml").write_bytes(text)
        return ["run", str(world.tmp / "mine.yaml"), *world.tiny()]
    return make


def _alias_bomb(leaf: str, width: int = 9, depth: int = 9) -> str:
    """YAML anchors each holding `width` aliases of the one before: `width`^`depth` values
    once expanded, in a few hundred bytes (a 'billion laughs')."""
    members = (lambda name: "[" + ", ".join([name] * width) + "]") if leaf == "list" else \
        (lambda name: "{" + ", ".join(f"k{i}: {name}" for i in range(width)) + "}")
    lines = [f"  a0: &a0 {members('1')}"]
    lines += [f"  a{i}: &a{i} {members(f'*a{i - 1}')}" for i in range(1, depth)]
    return "x-anchors:\n" + "\n".join(lines) + "\n"


def alias_bomb(leaf: str, key: str):
    section, name = key.split(".")
    return recipe((_alias_bomb(leaf) + f"{section}:\n  {name}: *a8\n").encode())


def override(*overrides: str):
    return lambda world: ["run", "default", *world.tiny(*overrides)]


def status_of_a_file(verb: str):
    def make(world):
        (world.tmp / "afile").write_text("x")
        return [verb, "status", str(world.tmp / "afile")]
    return make


def report_out(where: Callable[[World], Path]):
    def make(world):
        return ["report", str(world.run_copy()), "--out", str(where(world))]
    return make


def output_dir_a_file(world):
    (world.tmp / "afile").write_text("x")
    return ["run", "default", *world.tiny(f"output_dir={world.tmp / 'afile' / 'runs'}")]


def output_dir_read_only(world):
    return ["run", "default", *world.tiny(
        f"output_dir={world.mount('ro', 'ro,size=64k') / 'runs'}")]


def disk_fills_up(world):
    disk = world.mount("disk", "size=512k")  # one checkpoint (~320 KiB) fits, two do not
    return ["run", "default", *world.tiny(f"output_dir={disk}", "run_name=full",
                                          "train.max_steps=4", "checkpoint.every_steps=1")]


def nothing_half_written(world):
    left = [p.name for p in (world.tmp / "disk").rglob("*")
            if p.name.endswith((".tmp", ".partial"))]
    assert not left, left
    assert (world.tmp / "disk" / "full" / "checkpoints" / "step_00000001" / "meta.json").is_file()


def submit(*options: str):
    def make(world):
        os.environ["HOME"] = str(world.tmp / "home")  # restored by the test's monkeypatch
        return ["submit", "default", *world.tiny(), "--gpus", "1", "--dry-run", *options]
    return make


def odd_files_in_an_image_folder(world):
    root = write_image_folder(world.tmp / "images" / "train", per_class=8)
    write_image_folder(world.tmp / "images" / "val", per_class=4)
    os.mkfifo(root / "cat" / "x.jpg")
    (root / "dog" / "zero.jpg").symlink_to("/dev/zero")
    return ["run", "default", *world.tiny("data.dataset=imagefolder",
                                          f"data.path={world.tmp / 'images'}")]


def a_fifo_in_a_list(world):
    write_image_folder(world.tmp / "src", per_class=3)
    os.mkfifo(world.tmp / "src" / "fifo.jpg")
    lines = [f"{p.relative_to(world.tmp / 'src')},{p.parent.name}"
             for p in sorted((world.tmp / "src").glob("*/*.jpg"))]
    (world.tmp / "src" / "list.csv").write_text("\n".join([*lines, "fifo.jpg,cat"]) + "\n")
    return ["pack", str(world.tmp / "src" / "list.csv"), str(world.tmp / "out")]


def a_very_wide_image(world):
    root = write_image_folder(world.tmp / "src", per_class=3)
    Image.new("RGB", (70000, 2)).save(root / "cat" / "wide.png")
    return ["pack", str(world.tmp / "src"), str(world.tmp / "out"), "--store", "raw"]


def linked_out(name: str, folder: bool = False, *extra: str):
    """The trained run resumed with `name` in it a link out of the run: to the victim file,
    or (`folder`) to a folder beside the victim holding what was there."""
    def make(world):
        run = world.run_copy()
        if folder:
            target = world.victim.parent / name
            if (run / name).exists():
                shutil.move(run / name, target)
            else:
                target.mkdir()
        else:
            target = world.victim
            (run / name).unlink(missing_ok=True)
        (run / name).symlink_to(target)
        world.outside = sorted(p.name for p in world.victim.parent.rglob("*"))
        return world.resume(*extra)
    return make


def nothing_written_outside(world):
    assert sorted(p.name for p in world.victim.parent.rglob("*")) == world.outside


FAULTS = [
    # files hpctrain did not write: checkpoints
    Fault("checkpoint index that runs a command", checkpoint_made(
        lambda c, w: plant_hostile_index(c, w.marker)), 2,
        (".metadata is not a checkpoint index", "system")),
    Fault("checkpoint index that runs a command, newest of two", checkpoint_made(
        lambda c, w: plant_hostile_index(c, w.marker), asked_for=False), 0,
        ("warning: set aside step_00000004", ".metadata is not a checkpoint index",
         "resuming step_00000002"), after=set_aside_with_a_warning),
    Fault("checkpoint value that runs a command", checkpoint_made(
        lambda c, w: plant_hostile_value(c, w.marker), asked_for=False), 2,
        ("is not plain data",)),
    Fault("checkpoint index naming a file outside", checkpoint_made(_index_naming_outside), 2,
          ("not a file of the checkpoint folder",)),
    Fault("damaged checkpoint asked for by name", checkpoint_made(
        lambda c, w: DAMAGE["truncated shard"][0](c)), 2, ("step_00000004", "truncated")),
    Fault("every checkpoint damaged", all_damaged, 2,
          ("every checkpoint of", "step_00000002", "step_00000004")),
    Fault("resume with another model", lambda w: (w.run_copy(), w.resume(
        "model.name=hpctrain:resnet_small"))[1], 2, ("model.name is",)),
    Fault("resume with another global batch", lambda w: (w.run_copy(), w.resume(
        "train.batch_size=8"))[1], 2, ("global batch of 16",)),
    # files hpctrain did not write: packs
    Fault("pack id naming a folder outside", manifest(_set(
        "pack_id", lambda w: str(w.victim.parent))), 2, ("pack.json: pack_id",)),
    Fault("pack id climbing out", manifest(_set("pack_id", "../../victim")), 2, ("pack_id",)),
    Fault("shard naming a file outside", manifest(_set(
        "splits/train/shards/0/file", "../victim/precious.txt")), 2,
        ("splits.train.shards.0.file",)),
    Fault("index naming an absolute path", manifest(_set(
        "splits/train/index/file", lambda w: str(w.victim))), 2, ("splits.train.index.file",)),
    Fault("manifest of the wrong shape", manifest(lambda d, w: [d]), 2,
          ("not a hpctrain-shards",)),
    Fault("manifest whose splits are a list", manifest(_set("splits", [])), 2, ("splits",)),
    Fault("manifest without classes", manifest(lambda d, w: d.pop("classes") and None), 2,
          ("classes",)),
    Fault("index naming a shard that is not there", index(_field("shard", 9)), 2,
          ("names shard 9",)),
    Fault("index with a label out of range", index(_field("label", 99)), 2,
          ("has label 99, the pack has 2 classes",)),
    Fault("index with an image of width 0", index(_field("width", 0)), 2,
          ("image of 0 x",)),
    Fault("index pointing past its shard", index(_shift_range), 2,
          ("beyond the end of its shard",)),
    Fault("index whose byte range wraps past 2**64", index(_wrapping_range), 2,
          ("record 0 holds bytes 18446744069414584321 to 18446744073709551616",
           "beyond the end of its shard"), isolate=True),
    Fault("a shard that links out of the pack", a_shard_linking_out, 2,
          ("train-00000.tar is a link to", "outside the pack")),
    Fault("JPEG larger than its index says", index(_field("width", 20)), 2,
          ("index says 20 x",)),
    Fault("index holding pickled objects", index(_object_index, allow_pickle=True), 2,
          ("is not an index",)),
    # the run directory: nothing is written through a link (issue 51)
    Fault("config.yaml of a resumed run a link out", linked_out("config.yaml"), 2,
          ("config.yaml is a symbolic link (to", "Remove the link"),
          after=nothing_written_outside),
    Fault("metrics.jsonl of a resumed run a link out", linked_out("metrics.jsonl"), 2,
          ("metrics.jsonl is a symbolic link",), after=nothing_written_outside),
    Fault("summary.json.tmp planted as a link", linked_out("summary.json.tmp"), 2,
          ("summary.json.tmp is a symbolic link",), after=nothing_written_outside),
    Fault("checkpoints/ a link to a folder outside", linked_out("checkpoints", True), 2,
          ("checkpoints is a symbolic link",), after=nothing_written_outside),
    Fault("tb/ a link to a folder outside", linked_out("tb", True, "tensorboard=true"), 2,
          ("tb is a symbolic link",), after=nothing_written_outside),
    Fault("wandb/ a link to a folder outside", linked_out("wandb", True), 2,
          ("wandb is a symbolic link",), after=nothing_written_outside),
    # sources
    Fault("list that is not UTF-8", csv_list(b"a.jpg,cat\n\xff\xfe.jpg,dog\n"), 2,
          ("not UTF-8",)),
    Fault("list with an absurd label", csv_list(b"a.jpg,0\nb.jpg,999999999\n"), 2,
          ("list.csv:2: label 999999999",), isolate=True),
    Fault("list with a NUL byte in a path", csv_list(b"a.jpg,cat\nb\x00.jpg,dog\n"), 0,
          ("skipped unreadable", "null byte")),
    Fault("pack into a file", lambda w: (w.tmp.joinpath("afile").write_text("x"), [
        "pack", str(write_image_folder(w.tmp / "src")), str(w.tmp / "afile")])[1], 2,
        ("is a file",)),
    Fault("a FIFO and a link to /dev/zero among the images", odd_files_in_an_image_folder,
          0, ("completed",), isolate=True),
    Fault("a FIFO in a list", a_fifo_in_a_list, 0, ("not a regular file",), isolate=True),
    Fault("an image too wide for the index", a_very_wide_image, 0,
          ("wide.png", "70000 x 2 pixels")),
    # configuration and places
    Fault("infinite epochs", lambda w: ["run", "default", *w.tiny("train.epochs=.inf")], 2,
          ("train.epochs", "finite")),
    Fault("a seed numpy cannot take", lambda w: ["run", "default", *w.tiny(
        "seed=100000000000000000000")], 2, ("seed",)),
    Fault("run_name climbing out", lambda w: ["run", "default", *w.tiny("run_name=../x")], 2,
          ("run_name", "not a plain name")),
    Fault("absolute run_name", lambda w: ["run", "default", *w.tiny(f"run_name={w.victim}")],
          2, ("not a plain name",)),
    Fault("recipe name climbing out", recipe(b"name: ../../x\n"), 2, ("not a plain name",)),
    Fault("recipe that is not UTF-8", recipe(b"\xff\xfe\x00train: 1\n"), 2, ("not UTF-8",)),
    Fault("an empty recipe", recipe(b""), 2, ("mine.yaml is empty",)),
    Fault("a recipe of comments only", recipe(b"# to do\n"), 2,
          ("mine.yaml is empty (or only comments)",)),
    # recipes that bomb (issue 51): each refused in one line, in bounded time and memory
    Fault("an alias bomb of lists as train.batch_size", alias_bomb("list", "train.batch_size"),
          2, ("mine.yaml: refused: it holds more than 100,000 values (its aliases expanded)",),
          isolate=True),
    Fault("an alias bomb of mappings in model.kwargs", alias_bomb("dict", "model.kwargs"), 2,
          ("it holds more than 100,000 values",), isolate=True),
    Fault("an alias bomb as an override", override("train.batch_size=[" + ", ".join(
        f"&a{i} [" + ", ".join(["1" if i == 0 else f"*a{i - 1}"] * 9) + "]" for i in range(9))
        + "]"), 2, ("override train.batch_size=...: it holds more than 100,000 values",),
        isolate=True),
    Fault("an integer of 100,000 digits", recipe(b"seed: " + b"9" * 100000 + b"\n"), 2,
          ("an integer of 100,000 digits (at most 40) (line 1, column 7)",), isolate=True),
    Fault("100,000 nested lists", recipe(b"model:\n  kwargs:\n    a: " + b"[" * 100000
                                         + b"]" * 100000 + b"\n"), 2,
          ("nested deeper than 64 levels",), isolate=True),
    Fault("900 levels of model.kwargs", recipe(("model:\n  kwargs:\n" + "".join(
        "  " * (i + 2) + f"k{i}:\n" for i in range(900)) + "  " * 902 + "v: 1\n").encode()), 2,
        ("nested deeper than 64 levels",), isolate=True),
    Fault("a section given twice", recipe(b"train:\n  max_steps: 3\ntrain:\n  epochs: 1\n"), 2,
          ("found the key 'train' twice (the first would be dropped) (line 3, column 1)",)),
    Fault("a flag as a count", recipe(b"checkpoint:\n  keep_last: true\n"), 2,
          ("checkpoint.keep_last = True", "true is a flag, not a number")),
    Fault("a flag as the batch size", override("train.batch_size=true"), 2,
          ("train.batch_size = True", "true is a flag, not a number")),
    Fault("a built-in dataset of 10^12 samples", override(f"data.shapes.num_train={10**12}"),
          2, ("data.shapes.num_train = 1000000000000", "less than or equal to 10000000"),
          isolate=True),
    Fault("tune status of a file", status_of_a_file("tune"), 2, ("not a search folder",)),
    Fault("scale status of a file", status_of_a_file("scale"), 2, ("not a scaling study",)),
    Fault("report --out into a folder that cannot be made", report_out(
        lambda w: Path("/proc/nowhere/r.html")), 2, ("cannot write the report there",)),
    Fault("report --out that is a folder", report_out(lambda w: w.tmp), 2, ("is a folder",)),
    Fault("report --out in /proc", report_out(lambda w: Path("/proc/r.html")), 2,
          ("cannot write the report there",)),
    Fault("output_dir that is a file", output_dir_a_file, 2, ("is a file",)),
    Fault("output_dir on a read-only file system", output_dir_read_only, 2,
          ("cannot write in", "Read-only file system")),
    Fault("a disk that fills up", disk_fills_up, 2,
          ("No space left on device", "step_00000001 is the last good checkpoint"),
          after=nothing_half_written),
    # submit
    Fault("submit --nodes 0", submit("--nodes", "0"), 2, ("--nodes",)),
    Fault("submit --gpus -1", submit("--gpus", "-1"), 2, ("--gpus",)),
    Fault("submit --cpus-per-gpu 0", submit("--cpus-per-gpu", "0"), 2, ("--cpus-per-gpu",)),
    Fault("submit --max-requeues -1", submit("--max-requeues", "-1"), 2, ("--max-requeues",)),
    Fault("submit --job-name with a path", submit("--job-name", "../x"), 2,
          ("--job-name", "not a plain name")),
    Fault("submit --venv that does not exist", submit("--venv", "/nonexistent/venv"), 2,
          ("--venv /nonexistent/venv", "bin/activate is missing")),
    Fault("submit --container that does not exist", submit("--container", "/none.sif"), 2,
          ("--container /none.sif",)),
    Fault("submit --time 0", submit("--time", "0"), 2, ("--time",)),
    Fault("submit --extra-sbatch with shell", submit("--extra-sbatch", "--x=$(touch y)"), 2,
          ("--extra-sbatch",)),
]


# ---- the runner ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def trained(tmp_path_factory, shapes_cache) -> Path:
    """A tiny run with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("faults-run")
    world = World(out, shapes_cache, out, out)
    assert cli.main(["run", "default", *world.tiny("run_name=trained", "train.max_steps=4",
                                                   "checkpoint.every_steps=2")]) == 0
    return out / "runs" / "trained"


@pytest.fixture(scope="session")
def packed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faults-pack")
    write_image_folder(root / "images" / "train", per_class=12)
    write_image_folder(root / "images" / "val", per_class=4)
    pack(root / "images", root / "packed", PackOptions(shard_bytes=4000), workers=1,
         log=lambda *_: None)
    return root / "packed"


@pytest.fixture
def world(tmp_path, shapes_cache, trained, packed, monkeypatch):
    monkeypatch.setenv("HOME", os.environ.get("HOME", str(tmp_path)))
    made = World(tmp_path, shapes_cache, trained, packed)
    yield made
    for point in made.mounts:
        subprocess.run(["umount", str(point)], check=True)


def _run(world: World, arguments: list[str], isolate: bool, capsys) -> tuple[int, str]:
    if isolate:  # within 4 GiB of address space: a broken defence must not take the machine
        done = subprocess.run([sys.executable, "-m", "hpctrain", *arguments],
                              capture_output=True, text=True, timeout=300,
                              preexec_fn=AddressSpaceLimit(4 << 30))
        return done.returncode, done.stdout + done.stderr
    try:
        code = cli.main(arguments)
    except SystemExit as stop:  # argparse's usage errors end there, as in the console
        code = stop.code
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_a_faulty_input_ends_in_its_exit_code_and_a_message_naming_it(fault, world, capsys):
    code, said = _run(world, fault.make(world), fault.isolate, capsys)
    assert code == fault.code, said[-3000:]
    for words in fault.words:
        assert words in said, said[-3000:]
    assert "Traceback" not in said
    if code == 2:
        assert said.count("error:") == 1  # one message, not a chain of them
    assert not world.marker.exists(), "a payload ran"
    assert world.victim.read_text() == "precious", "a file outside was touched"
    if fault.after is not None:
        fault.after(world)


# ---- kill -9 soak -------------------------------------------------------------------------

SOAK = ("deterministic=true", "train.max_steps=150", "checkpoint.every_steps=1",
        "checkpoint.keep_last=3", "data.num_workers=1", "optim.ema.enabled=true",
        "train.log_every=3")


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_ends_like_an_undisturbed_run(world):
    """SIGKILL lands anywhere: in a step, in a save (a checkpoint every step), in a rename.
    After each, the newest checkpoint is whole, resume=auto continues, and the run that was
    killed again and again ends bitwise equal to one that never was (and saved only at its
    end: 150 saves cost 8 s here, and change nothing of the training)."""
    from training_state import assert_same_training_state, final_state

    from hpctrain.runs.directory import list_checkpoints
    from hpctrain.train.checkpoints.safe_checkpoint import problem

    reference = world.tiny(*SOAK, "run_name=undisturbed", "checkpoint.every_steps=150")
    assert cli.main(["run", "default", *reference]) == 0
    killed = world.tmp / "runs" / "killed"
    metrics, rng, kills = killed / "metrics.jsonl", np.random.default_rng(16), []
    command = [sys.executable, "-m", "hpctrain", "run", "default",
               *world.tiny(*SOAK, "run_name=killed", "resume=auto")]
    while len(kills) < 6:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        before = metrics.read_text().count("\n") if metrics.exists() else 0
        while process.poll() is None and not (metrics.exists() and
                                              metrics.read_text().count("\n") > before):
            time.sleep(0.01)  # until training has begun (or the run ended)
        delay = float(rng.uniform(0, 1.0))
        try:
            process.wait(timeout=delay)
            break  # finished before the kill: the soak is over
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        newest = list_checkpoints(killed / "checkpoints")
        kills.append((round(delay, 3), newest[-1].name if newest else None))
        assert not newest or problem(newest[-1]) is None, kills
    assert cli.main(["run", "default", *world.tiny(*SOAK, "run_name=killed",
                                                   "resume=auto")]) == 0, kills
    assert len(kills) >= 5, f"too few kills landed before the run ended: {kills}"
    assert_same_training_state(final_state(world.tmp / "runs" / "undisturbed"),
                               final_state(killed))
