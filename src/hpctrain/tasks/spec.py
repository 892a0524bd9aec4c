"""What a task is, as hpctrain's other rooms ask it: a `TaskSpec`.

A spec is read when a recipe is (config.py checks a task's name and the data it learns
from against it), so it holds plain values and functions and imports no torch: the torch
side of a task (its batches, loss and metrics on the device, `steps.Task`) is made by
`build`, when a run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Curve:
    """One line of the run report: on which panel, its label, from which metrics.jsonl
    records (`kind`) and which of their keys."""

    panel: str
    label: str
    kind: str
    key: str


@dataclass(frozen=True)
class TaskSetup:
    """What `build` is given by the engine: the recipe, the device, the data's classes or
    answer marks, the per-device batch, whether batches are laid out channels_last;
    `model`: the module the engine steps, before any wrapper (a LightningModule's adapter,
    whose logged names its task reads). What differs by data kind a task asks of the kind's
    spec through `batcher()` and `fact(name)`, made when it asks."""

    config: object  # config.Config (not imported: config asks this module)
    device: object  # torch.device
    num_classes: int | None
    answer: tuple[int, int] | None
    batch_size: int
    channels_last: bool = False
    model: object = None  # torch.nn.Module

    def batcher(self) -> Callable:
        """The data kind's device batcher (`DataKind.batcher`): a host batch onto the
        device, ready for the model (images: uint8 to normalised)."""
        data = self.config.data
        return data.kind_spec.batcher(self.device, data, self.channels_last)

    def fact(self, name: str):
        """What the data kind tells its tasks by `name` (`DataKind.task_facts`: the axis
        point clouds turn about, which may read the dataset's files)."""
        data = self.config.data
        return data.kind_spec.task_facts[name](data)


@dataclass(frozen=True)
class Measured:
    """What the engine measured of a run, from which a task's `figures` picks its own
    summary.json figures (the engine sits above this module, so it hands the values in).
    `mfu` is None where the task has no `flops_per_unit` or the device's peak is unknown."""

    samples_per_second: float | None
    units_per_second: float | None
    best_val_loss: float | None
    final_eval: dict | None
    padding_fraction: float | None
    parameters: int
    mfu: float | None
    mfu_peak: str | None
    mfu_formula: str


@dataclass(frozen=True)
class OwnSteps:
    """What a task changes in the engine's build when its model brings its own steps and
    optimiser (a LightningModule), asked by train/build.py, which names no such task:

    - `word`: what such a model is, in messages ("a LightningModule");
    - `claims(model)`: the model built is one (every other task refuses it, naming this one);
    - `adapt(model, device, distributed, data)`: the module the engine steps, after the
      model's own preparation (once a node: `distributed.node_leader_first`), its figures
      summed over `distributed`'s ranks, `data`'s data module beside it;
    - `optimizer(adapted, config, position) -> (optimizer, schedule)`: its own, with its
      callbacks sorted out (`position`: the run's length, ranks and folder, by name).

    The adapter answers the rest itself: `compile_forward(mode)`, `batch_hooks(optimizer)`,
    `keep_best`, `checkpoint_state()`."""

    word: str
    claims: Callable[[object], bool]
    adapt: Callable
    optimizer: Callable


def _one_unit_per_sample(config) -> int:
    return 1


@dataclass(frozen=True)
class TaskSpec:
    """One task kind.

    - `name`: the recipe's `task:` and summary.json's `task`;
    - `data_kind`: what its samples are (images, tokens, points, tensors): `task: auto`
      picks the task of the data's kind, and a task is refused on data of another kind;
    - `unit`: what its throughput counts (images, tokens, clouds);
    - `objective`: what `hpctrain tune` optimises by default, `SUMMARY_KEY:max|min`;
    - `default_model`: the model of a recipe that names none (`model.name: auto`); "" for
      a task on your own tensors, which has none;
    - `curves`: its own lines in the run report, beside those every run has;
    - `figures(measured) -> dict`: its own figures in summary.json (`Measured`);
    - `rate_label`: its unit in the progress line ("img" in "1,200 img/s");
    - `sample_size`: the setting that sets a sample's size, which out-of-memory advice
      names ("data.images.image_size"; None: your own tensors, sized by your code);
    - `units_per_sample(config)`: the throughput units in one sample;
    - `flops_per_unit(model_flops, config)`: the model FLOPs per unit behind its MFU (None:
      no MFU);
    - `build(setup) -> steps.Task`: its batches, loss and metrics on the device;
    - `describe(config, num_classes, vocab_size)`: its samples, in the run's banner;
    - `check_model(model, vocab_size, config)`: a model that cannot learn this data,
      refused before training (or None);
    - `classes_from_output`: where neither the recipe nor the data says how many classes
      there are, the width of the model's output is the number (the engine reads it);
    - `targets`: what a sample's target is: classes (an integer label), labels (a multi-hot
      vector), mask (a class per element), values (numbers) or any (the model's own steps
      take the batch as it is: a LightningModule);
    - `names_figures`: its metrics come named as they are recorded (a LightningModule's
      logged names), not to be prefixed train_ and val_ by the engine;
    - `own_steps`: the model brings its own steps and optimiser (a LightningModule), and
      what that changes in the build (`OwnSteps`); None: the engine steps a plain module;
    - `fit_defaults`: the settings (dotted keys) `hpctrain.fit` trains this task with where
      neither a recipe nor you set them (hpctrain's own defaults are the images'), said in its
      banner.
    """

    name: str
    data_kind: str
    unit: str
    objective: str
    default_model: str
    curves: tuple[Curve, ...]
    figures: Callable[[Measured], dict]
    rate_label: str
    sample_size: str | None
    build: Callable
    describe: Callable[[object, int | None, int | None], str]
    check_model: Callable | None = None
    units_per_sample: Callable[[object], int] = _one_unit_per_sample
    flops_per_unit: Callable[[object, object], float] | None = None
    classes_from_output: bool = False
    targets: str = "classes"
    names_figures: bool = False
    own_steps: OwnSteps | None = None
    fit_defaults: Mapping[str, object] = field(default_factory=dict)

    @property
    def steps_model(self) -> bool:
        """The model brings its own steps (`own_steps`)."""
        return self.own_steps is not None

    def figure_name(self, stage: str, name: str) -> str:
        """One of its metrics as metrics.jsonl records it: `stage`_NAME (train_accuracy,
        val_accuracy), or as the task named it (names_figures)."""
        return name if self.names_figures else f"{stage}_{name}"
