"""Your own tensors: the data kind of the tasks on samples of any shape (classification,
regression, segmentation, a LightningModule's). Its datasets are always your own
(data/user_datasets.py); the tensors reach the model as they were made (tasks/tensors.py)."""

from __future__ import annotations

from hpctrain.data.kind import DataKind, moving_batcher, own_check
from hpctrain.tasks import tensors

_INPUTS = "a tensor or array of any shape (or a tuple or dict of them)"
EXPECTED = {"classes": f"(inputs, label): {_INPUTS} and an integer label",
            "values": f"(inputs, target): {_INPUTS} and a number or a float tensor",
            "labels": f"(inputs, target): {_INPUTS} and a multi-hot vector (C,) of 0s and 1s",
            "mask": f"(inputs, mask): {_INPUTS} and an integer tensor of a class for every "
                    "element"}

SPEC = DataKind(
    name=tensors.KIND, samples_word="your own tensors",
    model_hint="your own model (model.name: path/to/file.py:build)",
    unit=lambda data: "sample", batcher=moving_batcher, any_shape=True,
    own_sample_problem=own_check("tensor_sample_problem"),
    own_expected=lambda data: EXPECTED[data.targets])
