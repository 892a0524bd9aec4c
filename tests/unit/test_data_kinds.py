"""Every registered data kind's built-in datasets honour the contract data/kind.py writes
down: indexed by a SampleKey (not an int) at the kind's key size, a validation set indexed
by the kind's sample_key, samples its collate batches, and datasets a forkserver's workers
can be handed. The kinds and their datasets are read from the registry, so a
new kind is held to it without an edit here (its datasets at their default sizes where
SMALL has none)."""

from __future__ import annotations

import pytest
from torch.utils.data import default_collate

from hpctrain.config import load_config
from hpctrain.data import kinds
from hpctrain.data.kind import BOUNDED_SHAPES
from hpctrain.data.sampling import SampleKey
from hpctrain.data.worker_start import not_shippable

# settings that keep each generated dataset to a few seconds' making
SMALL = {
    "shapes": ["data.shapes.num_train=32", "data.shapes.num_val=10",
               "data.shapes.image_size=16", "data.images.image_size=16"],
    "synthetic": ["data.synthetic.num_train=8", "data.synthetic.num_val=4",
                  "data.synthetic.num_classes=3", "data.images.image_size=16"],
    "shapes3d": ["data.shapes3d.num_train=10", "data.shapes3d.num_val=10",
                 "data.points.num_points=64"],
    "arithmetic": ["data.arithmetic.num_train=40", "data.arithmetic.num_val=10",
                   "data.arithmetic.max_operand=9", "data.tokens.seq_len=16"],
}
GENERATED = [(kind.name, name) for kind in kinds.KINDS.values() if kind.datasets_of
             for name in kind.datasets if name not in kind.needs_path]


def test_every_kind_with_datasets_of_its_own_is_held_here():
    assert {name for _, name in GENERATED} >= set(SMALL)
    assert {kind for kind, _ in GENERATED} == {
        kind.name for kind in kinds.KINDS.values() if kind.datasets_of
        and set(kind.datasets) - set(kind.needs_path)}


@pytest.mark.parametrize("kind_name,dataset", GENERATED)
def test_a_kind_s_built_in_datasets_honour_the_dataset_contract(kind_name, dataset, tmp_path):
    overrides = [f"data.dataset={dataset}", *SMALL.get(dataset, []),
                 *[f"data.{section}.cache_dir={tmp_path}" for section in ("shapes", "shapes3d",
                                                                        "arithmetic")]]
    data = load_config("default", [*overrides, "model.name=auto", "task=auto"]).data
    kind = kinds.spec(kind_name)
    assert data.kind == kind_name
    train, val, _ = kind.datasets_of(data, 0, 0, None)
    assert len(train) > 0 and len(val) > 0
    key = SampleKey(0, 0, kind.key_size(data, 0))
    samples = [train[key], train[key._replace(index=len(train) - 1)]]
    collate = kind.collate(data) or default_collate
    batch = collate(samples)
    assert batch is not None
    assert val[kind.sample_key(data, 0)] is not None
    assert not_shippable([train, val]) is None  # what a forkserver's workers are handed
    assert kind.shapes(data) in BOUNDED_SHAPES  # one graph per shape compiles a few


OWN_MODELS = [(kind.name, name) for kind in kinds.KINDS.values() for name in kind.models]


@pytest.mark.parametrize("kind_name,model", OWN_MODELS)
def test_a_kind_s_own_models_are_made_for_the_data_s_classes(kind_name, model):
    """A kind names its own models by where they are (`hpctrain:NAME`); each is made with
    the data's classes (a wrapper that hid the factory's signature once made PointNet with
    its default 40)."""
    import torch
    from torch import nn

    from hpctrain.models.model_names import build_model

    with torch.device("meta"):
        made = build_model(f"hpctrain:{model}", 7, {}, kind=kind_name)
    assert [m.out_features for m in made.modules() if isinstance(m, nn.Linear)][-1] == 7
