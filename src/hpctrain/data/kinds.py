"""The data kinds hpctrain reads, by name: the one place that lists them.

Every other room asks a kind's spec (`spec(name)`, `of_dataset(name)`) instead of comparing
its name. To add a kind: a folder beside these with its datasets and its `kind.py` (the
`SPEC`: kind.py says what it holds), and its line below.
"""

from __future__ import annotations

from hpctrain.data.images import kind as images
from hpctrain.data.kind import DataKind
from hpctrain.data.points import kind as points
from hpctrain.data.tensors import kind as tensors
from hpctrain.data.tokens import kind as tokens

KINDS: dict[str, DataKind] = {kind.SPEC.name: kind.SPEC for kind in (
    images, tokens, points, tensors)}
BUILTIN_DATASETS = tuple(name for kind in KINDS.values() for name in kind.datasets)
NEEDS_PATH = tuple(name for kind in KINDS.values() for name in kind.needs_path)
# your own data, where the task does not say what it is (task: auto)
OWN_DATA = images.SPEC.name


def spec(name: str) -> DataKind:
    return KINDS[name]


def of_dataset(dataset: str) -> DataKind:
    """The kind of a built-in dataset."""
    return next(kind for kind in KINDS.values() if dataset in kind.datasets)


def sections() -> dict[str, type]:
    """Every kind's sections of the recipe's data section, field name -> Section class."""
    return {name: section for kind in KINDS.values() for name, section in kind.settings.items()}


def for_models() -> dict[str, DataKind]:
    """hpctrain's models made for one kind only -> that kind."""
    return {model: kind for kind in KINDS.values() for model in kind.models}


def own_models() -> dict[str, str]:
    """hpctrain's models made for one kind only, name -> where its factory is
    ("package.module:function": each kind's `models`)."""
    return {name: make for kind in KINDS.values() for name, make in kind.models.items()}
