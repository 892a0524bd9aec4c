"""The task of a LightningModule (`task: lightning`): its spec, which the registry lists.
What it changes in the engine's build is lightning_build.py's, reached through the spec's
`own_steps` when the build calls it (it needs torch; the spec is read with the recipe)."""

from __future__ import annotations

from hpctrain.tasks import tensors
from hpctrain.tasks.lightning import NAME, is_lightning_module, overrides
from hpctrain.tasks.spec import Measured, OwnSteps, TaskSetup, TaskSpec


def build(setup: TaskSetup):
    from hpctrain.tasks.lightning_step import task

    return task(setup.device, setup.model, SPEC.name, SPEC.unit,  # Lightning's does nothing
                evaluates=overrides(type(setup.model.module), "validation_step"))


def describe(config, num_classes: int | None, vocab_size: int | None) -> str:
    return "samples as your LightningModule's steps take them"


def figures(measured: Measured) -> dict:
    final = measured.final_eval or {}
    return {"images_per_second": None,  # summary.json has the key for every task
            "best_val_loss": measured.best_val_loss,
            **{f"final_{name}": value for name, value in final.items()}}


def _in_build(name: str):
    """tasks/lightning_build.py's `name`, imported when the build calls it (it needs torch)."""
    def call(*args):
        from hpctrain.tasks import lightning_build

        return getattr(lightning_build, name)(*args)
    return call


SPEC = TaskSpec(name=NAME, data_kind=tensors.KIND, unit="samples",
                objective="best_val_loss:min", default_model="", curves=(),
                figures=figures, rate_label="samples", sample_size=None, build=build,
                describe=describe, targets="any", names_figures=True,
                own_steps=OwnSteps(word="a LightningModule", claims=is_lightning_module,
                                   adapt=_in_build("adapted"),
                                   optimizer=_in_build("own_optimizer")))
