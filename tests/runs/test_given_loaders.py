"""DataLoaders where hpctrain expected Datasets (issue 53, items 2 and 4): hpctrain.fit takes
DataLoaders as Lightning's Trainer.fit does, and a LightningDataModule's (or a
LightningModule's own) loaders keep their batch size, collate, order, drop_last and workers:
the same steps an epoch and the same validation figures as Lightning's Trainer; a setting
told explicitly wins and the banner says what it replaced; under two processes the order is
split as Lightning's DistributedSampler splits it; what cannot be kept is refused by name.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_given_loaders.py, tests/cluster/test_given_loaders.py."""

from __future__ import annotations

import copy
import json
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, WeightedRandomSampler

import hpctrain
from hpctrain.errors import ConfigError, UserError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "lit_classifier.py"
sys.path.insert(0, str(FIXTURE.parent))
from lit_classifier import LitClassifier, blob_data  # noqa: E402

SETTINGS = dict(train={"epochs": 1, "log_every": 5}, tensorboard=False, report=False)


def _lightning() -> L.Trainer:
    return L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)


@pytest.mark.parametrize("batch, count", [(16, 400), (1, 64)])
def test_fit_takes_dataloaders_and_runs_the_steps_lightning_runs(tmp_path, capsys, batch,
                                                                 count):
    train, val = blob_data(count, 0), blob_data(100, 1)
    summary = hpctrain.fit(LitClassifier(), DataLoader(train, batch_size=batch, shuffle=True),
                           DataLoader(val, batch_size=32), output_dir=str(tmp_path), **SETTINGS)
    trainer = _lightning()
    trainer.fit(LitClassifier(), DataLoader(train, batch_size=batch, shuffle=True),
                DataLoader(val, batch_size=32))
    assert summary["steps"] == trainer.global_step == -(-count // batch)
    out = capsys.readouterr().out
    assert f"your DataLoaders kept: training batch {batch}, shuffled, drop_last False, 0 " \
           "workers; validation batch 32, in order, drop_last False, 0 workers" in out
    assert f"global batch {batch} (batch {batch} x 1 process(es)" in out


def test_a_batch_size_you_tell_hpctrain_replaces_the_loaders_and_is_said(tmp_path, capsys):
    summary = hpctrain.fit(LitClassifier(), DataLoader(blob_data(400, 0), batch_size=16),
                           DataLoader(blob_data(100, 1), batch_size=32),
                           output_dir=str(tmp_path), **{**SETTINGS, "train": {
                               "epochs": 1, "batch_size": 40}})
    assert summary["steps"] == 10
    assert "train.batch_size 40 (as you set it) replaces your training DataLoader's batch " \
           "size 16" in capsys.readouterr().out


class Mnistish(L.LightningDataModule):
    """A DataModule as the issue's user had: batch 16 shuffled, validation batch 32 dropping
    its last partial batch (100 samples: 96 evaluated)."""

    def setup(self, stage):
        self.train, self.val = blob_data(400, 0), blob_data(100, 1)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=32, drop_last=True)


def test_a_data_modules_loaders_give_lightnings_steps_and_validation_figures(tmp_path):
    """LitClassifier logs each validation batch's mean loss, which Lightning averages over
    the batches weighted by their size: with the DataModule's batch and drop_last kept, the
    figure is Lightning's own (lr 0: the weights Lightning validates are those trained)."""
    torch.manual_seed(0)
    module = LitClassifier(lr=0.0)
    summary = hpctrain.fit(copy.deepcopy(module), Mnistish(), output_dir=str(tmp_path),
                           **SETTINGS)
    theirs = _lightning().validate(copy.deepcopy(module), datamodule=Mnistish(),
                                   verbose=False)[0]
    assert summary["steps"] == 25
    assert summary["final_val_loss"] == pytest.approx(theirs["val_loss"], abs=1e-6)
    assert summary["final_val_acc"] == pytest.approx(theirs["val_acc"], abs=1e-6)


class OwnLoaders(LitClassifier):
    """A LightningModule bringing its own loaders, with a collate of its own."""

    def setup(self, stage):
        self.calls = getattr(self, "calls", 0) + 1
        self.train_set, self.val_set = blob_data(200, 0), blob_data(64, 1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=20, shuffle=True, collate_fn=stacked)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)


def stacked(samples):
    return torch.stack([x for x, _ in samples]), torch.stack([y for _, y in samples])


def test_a_lightning_module_brings_its_own_loaders(tmp_path, capsys):
    module = OwnLoaders()
    summary = hpctrain.fit(module, output_dir=str(tmp_path), **SETTINGS)
    assert summary["status"] == "completed" and summary["steps"] == 10 and module.calls == 1
    assert "training batch 20, shuffled, drop_last False, collate stacked" in \
        capsys.readouterr().out
    config = (Path(summary["run_dir"]) / "config.yaml").read_text()
    assert "dataset: given:OwnLoaders.train_dataloader" in config


class Counted(Dataset):
    """Blobs that remember which of their samples were read."""

    def __init__(self, count: int):
        self.data, self.read = blob_data(count, 0), set()

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        self.read.add(int(index))
        return self.data[index]


def test_a_sampler_of_your_own_is_kept(tmp_path):
    """A WeightedRandomSampler that never draws the odd samples: none of them is trained on,
    and an epoch is the sampler's length."""
    train = Counted(128)
    weights = torch.tensor([1.0, 0.0] * 64)
    summary = hpctrain.fit(LitClassifier(), DataLoader(train, batch_size=8, sampler=(
        WeightedRandomSampler(weights, num_samples=96))), DataLoader(blob_data(64, 1)),
        output_dir=str(tmp_path), **SETTINGS)
    assert summary["steps"] == 12
    trained = train.read - {0, 64, 127}  # those the checks before training read
    assert trained and all(index % 2 == 0 for index in trained)


@pytest.mark.parametrize("loaders, message", [
    (lambda: (DataLoader(blob_data(64, 0), batch_sampler=Endless()),
              DataLoader(blob_data(32, 1))),
     "the train DataLoader: a DataLoader with a batch_sampler of its own (Endless): it has no "
     "length, so an epoch has no end"),
    (lambda: (DataLoader(blob_data(64, 0)), DataLoader(blob_data(32, 1), batch_sampler=(
        BatchSampler(range(32), 8, False)))),
     "the val DataLoader: a DataLoader with a batch_sampler of its own (BatchSampler): "
     "evaluation counts every sample once in order"),
    (lambda: (DataLoader(blob_data(64, 0)), DataLoader(blob_data(32, 1), sampler=(
        WeightedRandomSampler(torch.ones(32), 32)))),
     "a validation DataLoader with a sampler of its own (WeightedRandomSampler): evaluation "
     "counts every sample once"),
    (lambda: (DataLoader(blob_data(64, 0), sampler=Endless()), DataLoader(blob_data(32, 1))),
     "its sampler Endless has no length, so an epoch has no end: give it __len__"),
    (lambda: (DataLoader(blob_data(64, 0), sampler=WeightedRandomSampler(torch.ones(64), 64)),),
     "train_data is a DataLoader with its own WeightedRandomSampler, which draws from the "
     "whole dataset: give val_data")])
def test_what_a_loader_sets_that_cannot_be_kept_is_refused_by_name(tmp_path, loaders,
                                                                  message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hpctrain.fit(LitClassifier(), *loaders(), output_dir=str(tmp_path), **SETTINGS)


class Endless(torch.utils.data.Sampler):
    """A sampler without a length: an epoch would have no end."""

    def __iter__(self):
        while True:
            yield 0


def test_no_data_is_refused_unless_the_module_brings_both_loaders(tmp_path):
    with pytest.raises(ConfigError, match="fit\\(\\): give train_data: a Dataset, a "
                                          "DataLoader or a LightningDataModule"):
        hpctrain.fit(torch.nn.Linear(8, 3))

    class TrainsOnItsOwn(LitClassifier):
        def train_dataloader(self):
            return DataLoader(blob_data(64, 0), batch_size=8)
    with pytest.raises(ConfigError, match="fit\\(TrainsOnItsOwn\\) with no data: the "
                                          "module has no val_dataloader of its own"):
        hpctrain.fit(TrainsOnItsOwn(), output_dir=str(tmp_path), **SETTINGS)


def test_memory_and_bench_data_take_the_batch_of_a_factorys_loaders(tmp_path, run_cli):
    """A recipe whose factory returns DataLoaders: `memory` and `bench data` speak of the
    loader's batch (the recipe does not set one)."""
    recipe = tmp_path / "loaders.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: loaders
        model: {{name: "{FIXTURE}:LitClassifier"}}
        data: {{dataset: "{FIXTURE}:blob_loaders", num_workers: 0}}
        output_dir: {tmp_path / "runs"}
        """))
    code, out, err = run_cli("memory", str(recipe), "device=cpu", "--gpu-memory", "1GiB",
                             "--json")
    assert code == 0, err
    assert json.loads(out)["estimate"]["batch_size"] == 24
    code, out, err = run_cli("bench", "data", str(recipe), "--seconds", "0.2", "--workers",
                             "1", "--prefetch", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["batch_size"] == 24
