"""The tasks hpctrain trains, by name: the one place that lists them.

Every other room asks a spec (`spec(name)`, `for_data(kind)`) instead of comparing a task's
name. To add a task: a module beside these with its `SPEC` (spec.py says what it holds) and
its line below; a new kind of data is a folder of data/ with its line in data/kinds.py.
"""

from __future__ import annotations

from hpctrain.tasks import (classification, image_classification, language_modeling,
                           lightning, lightning_task, multilabel, point_cloud_classification,
                           regression, segmentation)
from hpctrain.tasks.spec import Curve, TaskSpec

SPECS: dict[str, TaskSpec] = {task.SPEC.name: task.SPEC for task in (
    image_classification, language_modeling, point_cloud_classification, classification,
    multilabel, regression, segmentation, lightning_task)}
NAMES = tuple(SPECS)
# `task: auto`: the first task registered for the data's kind (another task on the same kind,
# a segmentation on images, is named in the recipe)
TASK_OF_DATA = {kind: next(name for name, spec in SPECS.items() if spec.data_kind == kind)
                for kind in dict.fromkeys(spec.data_kind for spec in SPECS.values())}
KIND_OF_TASK = {name: spec.data_kind for name, spec in SPECS.items()}
TARGETS_OF_TASK = {name: spec.targets for name, spec in SPECS.items()}
TASK_OBJECTIVE = {name: spec.objective for name, spec in SPECS.items()}


def spec(name: str) -> TaskSpec:
    return SPECS[name]


def for_model(reference: str) -> str | None:
    """The task a model demands whatever the data (`task: auto`): lightning for a
    LightningModule class; None for any other model, or one that does not import (building
    it says why)."""
    return lightning_task.SPEC.name if lightning.names_lightning_class(reference) else None


def claiming(model) -> TaskSpec | None:
    """The task whose model brings its own steps that `model` is (a LightningModule's), or
    None: every other task refuses it."""
    return next((task for task in SPECS.values()
                 if task.own_steps is not None and task.own_steps.claims(model)), None)


def for_data(kind: str) -> TaskSpec:
    """The task that learns from data of this kind (`task: auto`)."""
    return SPECS[TASK_OF_DATA[kind]]


def task_curves() -> list[Curve]:
    """Every task's own report lines, each once, in the registry's order."""
    return list(dict.fromkeys(curve for task in SPECS.values() for curve in task.curves))
