"""User code in recipes: a model factory named by file path or module, the facts of the data it
asks for, relative paths read from the recipe's folder, and each way it can be wrong (exit 2,
the culprit named).

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_user_code.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from user_nets import NETS, write

pytestmark = pytest.mark.usefixtures("forget_user_modules")  # each test's files: fresh modules


def test_a_model_file_next_to_the_recipe_trains_and_resumes_with_hpctrain_run(
        tmp_path, tiny, run_cli, monkeypatch):
    write(tmp_path / "project" / "models", "nets_run.py", NETS)
    recipe = tmp_path / "project" / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": {"name": "models/nets_run.py:SmallNet",
                                                "kwargs": {"width": 6}}}))
    overrides = [o for o in tiny("run_name=mine") if not o.startswith("model.name")]
    code, out, err = run_cli("run", str(recipe), *overrides)
    assert code == 0, err
    run = tmp_path / "runs" / "mine"
    recorded = yaml.safe_load((run / "config.yaml").read_text())["model"]["name"]
    # the relative path was read from the recipe's folder, and is recorded absolute
    assert recorded == f"{tmp_path / 'project' / 'models' / 'nets_run.py'}:SmallNet"
    assert "nets_run.py:SmallNet" in out
    # resumed from another directory: the recorded path still finds the file
    first = json.loads((run / "summary.json").read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = run_cli("run", str(recipe), *overrides, "train.epochs=2", "resume=auto")
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert "resuming" in out and summary["restarts"] == 1
    assert summary["steps"] == 2 * first["steps"]


DATA = '''
import os

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

import hpctrain


class Stripes(Dataset):
    """Class k: grey level 40 + 80 k; uint8 (H, W, 3) images, or float (3, H, W) ones."""

    classes = ["two", "three", "four"]

    def __init__(self, count, image_size, seed, floats=False, mark=None):
        self.count, self.size, self.seed, self.floats = count, image_size, seed, floats
        self.mark = mark

    def __setstate__(self, state):  # in a worker started by spawn or forkserver, not fork
        self.__dict__.update(state)
        if self.mark:
            open(f"{self.mark}/unpickled-{os.getpid()}", "w").close()

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        label = index % 3
        image = np.full((self.size, self.size, 3), 40 + 80 * label, np.uint8)
        if self.floats:
            return torch.from_numpy(image).permute(2, 0, 1).float() / 255 - 0.5, label
        return image, label


def make(image_size, seed, count=96, floats=False, mark=None):
    return (Stripes(count, image_size, seed, floats, mark),
            Stripes(24, image_size, seed + 1, floats, mark))


def as_dict(image_size, seed, mark=None):
    train, val = make(image_size, seed, mark=mark)
    return {"train": train, "val": val}


class Clouds(Dataset):
    classes = ["flat", "tall"]

    def __len__(self):
        return 32

    def __getitem__(self, index):
        points = torch.rand(64, 3, generator=torch.Generator().manual_seed(index))
        points[:, 2] *= 0.1 if index % 2 == 0 else 3.0
        return points, index % 2


def clouds():
    return Clouds(), Clouds()


class StripeStream(IterableDataset):
    """Stripes read in order, in a different order each epoch; split into `files` pieces that
    it shares out itself with hpctrain.shard, or (files=0) not split at all."""

    classes = ["two", "three", "four"]

    def __init__(self, count, image_size, files):
        self.count, self.size, self.files, self.epoch = count, image_size, files, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.count, generator=torch.Generator().manual_seed(self.epoch))
        if not self.files:
            yield from (self.item(int(i)) for i in order)
            return
        per_file = self.count // self.files
        for piece in hpctrain.shard(range(self.files)):
            yield from (self.item(int(i)) for i in order[piece * per_file:][:per_file])

    def item(self, index):
        label = index % 3
        noise = torch.randint(0, 30, (self.size, self.size, 3),
                              generator=torch.Generator().manual_seed(index))
        return (40 + 80 * label + noise).to(torch.uint8).numpy(), label


class SizedStripeStream(StripeStream):
    def __len__(self):
        return self.count


def stream(image_size, files=4, sized=True):
    kind = SizedStripeStream if sized else StripeStream
    return kind(96, image_size, files), Stripes(24, image_size, 1)


def stream_for_val(image_size):
    return Stripes(96, image_size, 0), StripeStream(24, image_size, 0)


class Counting(Dataset):
    """Blocks of ids counting up modulo 16 from a start of their own: each next id is the
    last one plus one. `wrong`: float blocks, as a tokenizer's output mistaken for ids."""

    vocab_size = 16

    def __init__(self, count, seq_len, wrong=False):
        self.count, self.seq_len, self.wrong = count, seq_len, wrong

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        ids = (torch.arange(self.seq_len + 1) + index) % 16
        return ids.float() if self.wrong else ids


def counting(seq_len, wrong=False):
    return Counting(128, seq_len, wrong), Counting(32, seq_len, wrong)


class Nameless(Counting):
    vocab_size = None


def nameless(seq_len):
    return Nameless(128, seq_len), Nameless(32, seq_len)
'''


@pytest.mark.parametrize("factory, floats, start", [
    ("make", False, "spawn"), ("as_dict", False, "forkserver"), ("make", True, "fork")])
def test_a_dataset_factory_trains_with_hpctrain_run(tmp_path, tiny, run_cli, factory, floats,
                                                    start):
    """uint8 (H, W, 3) samples are normalised on the device; float (3, H, W) ones are taken as
    they are; two DataLoader workers import the file, forked, spawned or from a forkserver."""
    path = write(tmp_path, "stripes_data.py", DATA)
    overrides = [o for o in tiny("run_name=stripes", "data.num_workers=2", "train.epochs=2",
                                 f"data.worker_start={start}")
                 if not o.startswith("data.shapes")]
    marks = tmp_path / "marks"
    marks.mkdir()
    code, out, err = run_cli("run", "default", *overrides, f"data.dataset={path}:{factory}",
                             f"data.kwargs.mark={marks}",
                             *(["data.kwargs.floats=true"] if floats else []))
    assert code == 0, err
    summary = yaml.safe_load((tmp_path / "runs" / "stripes" / "summary.json").read_text())
    assert "3 classes" in out and summary["steps"] == 2 * (96 // 16)
    assert summary["final_val_accuracy"] > 0.5  # chance: 1/3
    workers = {mark.name for mark in marks.iterdir()}
    assert len(workers) == (0 if start == "fork" else 4)  # 2 for train, 2 for val


def test_a_point_cloud_factory_trains_pointnet(tmp_path, tiny, run_cli):
    path = write(tmp_path, "cloud_data.py", DATA)
    overrides = [o for o in tiny("run_name=clouds", "train.batch_size=8")
                 if not o.startswith(("data.shapes", "model.name"))]
    code, out, err = run_cli("run", "default", *overrides, f"data.dataset={path}:clouds",
                             "task=point_cloud_classification",
                             "model.name=hpctrain:pointnet_small")
    assert code == 0, err
    summary = yaml.safe_load((tmp_path / "runs" / "clouds" / "summary.json").read_text())
    assert summary["task"] == "point_cloud_classification" and "2 classes" in out


BAD_DATA = DATA + '''
def one():
    return Stripes(8, 16, 0)


def numbers():
    return 5, 6


def empty():
    return Stripes(0, 16, 0), Stripes(4, 16, 0)


class Unlabelled(Stripes):
    classes = None


def no_classes():  # a batch's worth: the classes are asked once the loaders are made
    return Unlabelled(32, 16, 0), Unlabelled(8, 16, 0)


class Grey(Stripes):
    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        return (image[:, :, 0] if index == 4 else image), label


def grey():
    return Grey(8, 16, 0), Grey(8, 16, 0)


class Labelled(Stripes):
    def __getitem__(self, index):
        return super().__getitem__(index)[0], 7


def big_labels():
    return Labelled(8, 16, 0), Labelled(8, 16, 0)


class Broken(Stripes):
    def __getitem__(self, index):
        raise FileNotFoundError(f"/data/img_{index}.png")


def broken():
    return Broken(8, 16, 0), Broken(8, 16, 0)


class Dry(StripeStream):
    def __iter__(self):
        yield from ()


def dry_stream():
    return Dry(8, 16, 0), Stripes(4, 16, 0)


class Cut(StripeStream):
    def __iter__(self):
        raise ConnectionError("the object store is unreachable")


def cut_stream():
    return Cut(8, 16, 0), Stripes(4, 16, 0)
'''


@pytest.mark.parametrize("factory, message", [
    ("one", r"returned a Stripes; return the training and validation datasets"),
    ("numbers", r"returned a int for train, not a map-style torch.utils.data.Dataset"),
    ("empty", r"the train dataset of .*:empty is empty"),
    ("no_classes", r"how many classes\? .* set data.num_classes=N"),
    ("grey", r"train sample 4: its image is a ndarray of shape \(16, 16\) and dtype uint8; "
             r"expected \(image, label\): a uint8 \(H, W, 3\) image"),
    ("big_labels", r"train sample 0: its label is 7, outside 0..2 \(3 classes\)"),
    ("broken", r"train sample 0 cannot be read: FileNotFoundError: /data/img_0.png "
               r"\(at bad_data.py:\d+\)"),
    ("dry_stream", r"a pass over the stream gave worker 0 of 1 .* no items"),
    ("cut_stream", r"the train stream cannot be read: ConnectionError: the object store is "
                   r"unreachable \(at bad_data.py:\d+\)"),
    ("stream_for_val", r"returned an IterableDataset for val; the validation set must be "
                       r"map-style"),
])
def test_a_dataset_that_does_not_fit_is_explained(tmp_path, tiny, run_cli, factory, message):
    path = write(tmp_path, "bad_data.py", BAD_DATA)
    code, _, err = run_cli("run", "default", *tiny(f"data.dataset={path}:{factory}"))
    assert code == 2 and re.search(message, err), err


def stream_losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def test_a_stream_that_shares_itself_out_trains_and_resumes_exactly(tmp_path, tiny, run_cli):
    """4 files over 2 workers (hpctrain.shard), 96 items a pass: 6 steps an epoch. Stopped
    at step 4 and resumed, the run trains on as the uninterrupted one did: the skipped items
    are those of the steps already trained, worker by worker."""
    path = write(tmp_path, "stream_data.py", DATA)
    base = [o for o in tiny("data.num_workers=2", "schedule.name=constant", "train.log_every=1")
            if not o.startswith("data.shapes")] + [f"data.dataset={path}:stream"]
    code, out, err = run_cli("run", "default", *base, "run_name=straight", "train.max_steps=10")
    assert code == 0, err
    assert "(96 train / 24 val" in out
    straight = stream_losses(tmp_path / "runs" / "straight")
    assert len(straight) == 10
    code, _, err = run_cli("run", "default", *base, "run_name=stopped", "train.max_steps=4")
    assert code == 0, err
    code, out, err = run_cli("run", "default", *base, "run_name=stopped", "train.max_steps=10",
                             "resume=auto")
    assert code == 0 and "resuming" in out, err
    resumed = stream_losses(tmp_path / "runs" / "stopped")
    assert [resumed[step] for step in range(5, 11)] == \
        pytest.approx([straight[step] for step in range(5, 11)], abs=1e-6)


def test_a_stream_without_a_length_runs_train_max_steps_shared_item_by_item(tmp_path, tiny,
                                                                           run_cli):
    path = write(tmp_path, "plain_stream.py", DATA)
    base = [o for o in tiny("data.num_workers=2", "run_name=plain")
            if not o.startswith("data.shapes")] + [f"data.dataset={path}:stream",
                                                   "data.kwargs={files: 0, sized: false}"]
    code, _, err = run_cli("run", "default", *base)
    assert code == 2 and "is a stream without a length (no __len__): set train.max_steps" in err
    code, _, err = run_cli("run", "default", *base, "train.max_steps=15")
    assert code == 0, err
    summary = json.loads((tmp_path / "runs" / "plain" / "summary.json").read_text())
    assert summary["steps"] == 15 and summary["final_val_accuracy"] > 0.5
    code, out, err = run_cli("bench", "data", "default", *base, "--workers", "1",
                             "--prefetch", "2", "--seconds", "0.3")
    assert code == 0, err
    assert re.search(r"^\s+1\s+2\s+[\d,]+", out, re.MULTILINE), out


def test_token_blocks_of_your_own_train_a_language_model(tmp_path, run_cli):
    """Blocks of seq_len + 1 ids from a factory (given seq_len); the vocabulary from the
    dataset; hpctrain's GPT built for it."""
    path = write(tmp_path, "counting.py", DATA)
    common = [f"data.dataset={path}:counting", "task=language_modeling",
              "data.tokens.seq_len=16", "model.name=hpctrain:gpt_tiny", "model.kwargs.width=32",
              "model.kwargs.layers=1", "optim.name=adamw", "optim.lr=0.01",
              "schedule.name=constant", "data.num_workers=0", "tensorboard=false",
              f"output_dir={tmp_path / 'runs'}", "train.batch_size=16", "train.epochs=3",
              "train.log_every=8"]
    code, out, err = run_cli("run", "default", *common, "run_name=counting")
    assert code == 0, err
    summary = json.loads((tmp_path / "runs" / "counting" / "summary.json").read_text())
    assert summary["task"] == "language_modeling" and summary["steps"] == 3 * 128 // 16
    assert summary["best_val_perplexity"] < 4  # a uniform guess: 16
    code, _, err = run_cli("run", "default", *common, "data.kwargs.wrong=true")
    assert code == 2 and "train sample 0: it is a Tensor of shape (17,) and dtype " \
        "torch.float32; expected a block of data.tokens.seq_len + 1 = 17 integer token ids" in err
    code, _, err = run_cli("run", "default", *common, "data.tokens.vocab_size=8")
    assert code == 2 and "holds id 15, outside 0..7 (a vocabulary of 8)" in err
    code, _, err = run_cli("run", "default", *common, "data.kwargs.seq_len=20")
    assert code == 2 and "train sample 0: it is a Tensor of shape (21,) and dtype " \
        "torch.int64; expected a block of data.tokens.seq_len + 1 = 17" in err
    code, _, err = run_cli("run", "default", *common, f"data.dataset={path}:nameless")
    assert code == 2 and "how large is the vocabulary? The training dataset has no " \
        "`vocab_size`; set data.tokens.vocab_size=N" in err
    code, _, err = run_cli("run", "default", *common, "data.tokens.batching=documents")
    assert code == 2 and "your own token data comes as blocks" in err
    code, out, err = run_cli("memory", "default", *common, "device=cpu", "--gpu-memory",
                             "8GiB", "--json")
    assert code == 0, err
    estimate = json.loads(out)["estimate"]
    assert not any("assumed" in note for note in estimate["notes"])  # the data's vocabulary
    code, out, err = run_cli("bench", "data", "default", *common, "--workers", "1",
                             "--prefetch", "2", "--seconds", "0.3")
    assert code == 0, err


FOCAL = Path(__file__).resolve().parent.parent.parent / "examples" / "csv_images" / "focal.py"


def test_a_loss_and_metrics_of_your_own_are_trained_with_and_reported(tmp_path, tiny, run_cli):
    code, _, err = run_cli("run", "default", *tiny("run_name=focal", "train.epochs=2"),
                           f"task.loss={FOCAL}:focal_loss",
                           f"task.metrics.top2={FOCAL}:top2_correct")
    assert code == 0, err
    records = [json.loads(line) for line in
               (tmp_path / "runs" / "focal" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert train and all(r["train_accuracy"] <= r["train_top2"] <= 1 for r in train)
    assert evals and all(r["val_accuracy"] <= r["val_top2"] <= 1 for r in evals)


def test_the_loss_of_your_own_is_the_one_trained_and_recorded(tmp_path, tiny, run_cli):
    path = write(tmp_path, "shifted.py", """
        import torch.nn.functional as F

        def shifted(logits, targets):  # the same gradients as cross-entropy, 100 higher
            return F.cross_entropy(logits, targets) + 100
        """)
    code, _, err = run_cli("run", "default", *tiny("run_name=shifted", f"task.loss={path}:shifted"))
    assert code == 0, err
    records = [json.loads(line) for line in
               (tmp_path / "runs" / "shifted" / "metrics.jsonl").read_text().splitlines()]
    assert all(100 < r["loss"] < 110 for r in records if r["kind"] == "train")


def test_a_loss_that_is_not_one_number_is_explained(tmp_path, tiny, run_cli):
    path = write(tmp_path, "losses.py", """
        import torch.nn.functional as F

        def per_sample(logits, targets):
            return F.cross_entropy(logits, targets, reduction="none")
        """)
    code, _, err = run_cli("run", "default", *tiny(f"task.loss={path}:per_sample"))
    assert code == 2
    assert f"task.loss {path}:per_sample returned a tensor of shape (16,): return one number " \
        "as a 0-d tensor" in err


def test_bench_data_and_memory_take_your_own_model_and_data(tmp_path, tiny, run_cli):
    data = write(tmp_path, "verb_data.py", DATA)
    nets = write(tmp_path, "verb_nets.py", NETS)
    own = [f"data.dataset={data}:make", f"model.name={nets}:SmallNet", "data.images.image_size=16",
           "data.num_workers=0"]
    code, out, err = run_cli("bench", "data", "default", *own, "train.batch_size=16",
                             "--workers", "1", "--prefetch", "2", "--seconds", "0.3")
    assert code == 0, err
    assert re.search(r"^\s+1\s+2\s+[\d,]+\s+<- best", out, re.MULTILINE), out
    # a training set smaller than one batch: before, the timing loop never ended
    code, _, err = run_cli("bench", "data", "default", *own, "train.batch_size=128",
                           "--workers", "1", "--seconds", "0.3")
    assert code == 2 and "the training set has 96 samples, fewer than one batch of " \
        "train.batch_size=128" in err
    code, out, err = run_cli("memory", "default", *own, "device=cpu", "--gpu-memory", "8GiB",
                             "--measure", "train.batch_size=8")
    assert code == 0, err
    assert "verb_nets.py:SmallNet" in out and "measured" in out
    # a model that does not run on fake tensors is measured instead of predicted
    code, out, err = run_cli("memory", "default", *own, f"model.name={nets}:Branchy",
                             "device=cpu", "--gpu-memory", "8GiB", "train.batch_size=8")
    assert code == 0, err
    assert "the model does not run on fake tensors" in out and "measured on the CPU" in out


def test_profile_takes_your_own_model_and_data(tmp_path, tiny, run_cli):
    data = write(tmp_path, "profiled_data.py", DATA)
    nets = write(tmp_path, "profiled_nets.py", NETS)
    code, out, err = run_cli("profile", "default", *tiny(
        f"data.dataset={data}:make", f"model.name={nets}:SmallNet", "train.batch_size=8"),
        "--steps", "2", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ranks"][0]["steps"] == 2 and report["verdict"]["bound"]
    assert Path(report["traces"][0]).is_file()
