"""Recipes of your own code that several lanes' tests train or check: a text classifier with
its own pad collate (fixtures/text_data.py), a LightningModule (fixtures/lit_classifier.py),
tasks on your own tensors (fixtures/tensor_data.py); each written as YAML into `tmp_path`."""

import textwrap
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
TEXT_DATA = FIXTURES / "text_data.py"
LIT_CLASSIFIER = FIXTURES / "lit_classifier.py"
TENSOR_DATA = FIXTURES / "tensor_data.py"


def text_recipe(tmp_path: Path, *extra: str) -> Path:
    recipe = tmp_path / "text.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: text
        task: classification
        model: {{name: "{TEXT_DATA}:classifier"}}
        data: {{dataset: "{TEXT_DATA}:sentences", collate: "{TEXT_DATA}:pad_collate",
                num_workers: 0}}
        optim: {{name: adamw, lr: 0.003}}
        schedule: {{name: constant}}
        train: {{epochs: 2, global_batch_size: 64}}
        output_dir: {tmp_path / "runs"}
        tensorboard: false
        report: false
        """) + "".join(f"{line}\n" for line in extra))
    return recipe


def lit_recipe(tmp_path: Path, *extra: str) -> Path:
    """The recipe; a `train: {...}` line among `extra` replaces its train section (a recipe
    gives each key once)."""
    train = next((line for line in extra if line.startswith("train:")),
                 "train: {epochs: 2, batch_size: 32, log_every: 4}")
    recipe = tmp_path / "lit.yaml"
    recipe.write_text("\n".join([
        "name: lit", f"model: {{name: {LIT_CLASSIFIER}:LitClassifier}}",
        f"data: {{dataset: {LIT_CLASSIFIER}:blobs, num_workers: 0}}",
        f"output_dir: {tmp_path / 'runs'}", train, "report: false",
        *(line for line in extra if not line.startswith("train:"))]) + "\n")
    return recipe


def tensor_recipe(tmp_path: Path, task: str, model: str, dataset: str, *extra: str) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: tensors
        task: {task}
        model: {{name: "{TENSOR_DATA}:{model}"}}
        data: {{dataset: "{TENSOR_DATA}:{dataset}", kwargs: {{count: 1024}}, num_workers: 0}}
        optim: {{name: adamw, lr: 0.01}}
        train: {{epochs: 5, batch_size: 64}}
        output_dir: {tmp_path / "runs"}
        tensorboard: false
        report: false
        """) + "".join(f"{line}\n" for line in extra))
    return recipe
