"""User code in recipes: a model factory named by file path or module, the facts of the data it
asks for, relative paths read from the recipe's folder, and each way it can be wrong (exit 2,
the culprit named)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.models.registry import build_model

NETS = '''
import torch
from torch import nn


class SmallNet(nn.Module):
    """A user's CNN: it asks for the classes and the image size by name."""

    def __init__(self, num_classes, image_size, width=8):
        super().__init__()
        self.seen = (num_classes, image_size, width)
        self.features = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, num_classes)

    def forward(self, images):
        return self.head(self.features(images))


def build_net(num_classes, width=8):
    return SmallNet(num_classes, 16, width)


def not_a_model(num_classes):
    return {"weights": None}


def fails(num_classes):
    raise ValueError("width must be even")
'''


@pytest.fixture(autouse=True)
def forget_user_modules(tmp_path):
    """Each test's files are fresh modules: undo the imports from tmp_path, and the sys.path
    entries, that it added."""
    path = list(sys.path)
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
    sys.path[:] = path


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(textwrap.dedent(text))
    return folder / name


def test_a_model_file_next_to_the_recipe_trains_with_hpctrain_run(tmp_path, tiny, run_cli):
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


def test_the_factory_gets_the_facts_it_names_and_the_kwargs(tmp_path):
    path = write(tmp_path, "nets_facts.py", NETS)
    model = build_model(f"{path}:SmallNet", 7, {"width": 4}, image_sizes=(16,))
    assert model.seen == (7, 16, 4)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 7)
    assert build_model(f"{path}:build_net", 3).head.out_features == 3  # no image_size asked


def test_a_module_reference_imports_from_the_path(tmp_path, monkeypatch):
    write(tmp_path / "mypkg", "__init__.py", "")
    write(tmp_path / "mypkg", "models.py", NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert build_model("mypkg.models:build_net", 5).head.out_features == 5


def test_a_path_on_the_command_line_is_read_from_the_current_directory(tmp_path,
                                                                        monkeypatch):
    write(tmp_path / "here", "nets_cli.py", NETS)
    monkeypatch.chdir(tmp_path / "here")
    config = load_config("default", ["model.name=nets_cli.py:build_net"])
    assert config.model.name == f"{tmp_path / 'here' / 'nets_cli.py'}:build_net"


@pytest.mark.parametrize("reference, source, message", [
    ("missing.py:build", None, r"no file .*missing\.py \(a relative path in a recipe"),
    ("broken.py:build", "import torch\ndef build(:\n", r"broken\.py:build does not import: "
     r"SyntaxError: .* \(at broken\.py:2\)"),
    ("raising.py:build", "import torch\nraise RuntimeError('no GPU here')\n",
     r"does not import: RuntimeError: no GPU here \(at raising\.py:2\)"),
    ("nets_bad.py:buld_net", NETS, r"has no 'buld_net'; close matches: build_net"),
    ("nets_bad.py:not_a_model", NETS, r"returned a dict, not a torch\.nn\.Module"),
    ("nets_bad.py:fails", NETS, r"nets_bad\.py:fails\(num_classes=3\) failed: ValueError: "
     r"width must be even \(at nets_bad\.py:\d+\)"),
    ("no_such_package.models:build", None, r"does not import: ModuleNotFoundError: No module "
     r"named 'no_such_package'; is it installed"),
])
def test_user_code_that_cannot_make_a_model_is_explained(tmp_path, monkeypatch, reference,
                                                         source, message):
    monkeypatch.chdir(tmp_path)
    if source is not None:
        write(tmp_path, reference.split(":")[0], source)
    with pytest.raises(ConfigError, match=message):
        build_model(reference, 3)


def test_a_file_named_like_an_imported_module_is_refused(tmp_path):
    path = write(tmp_path, "json.py", NETS)
    with pytest.raises(ConfigError, match=r"a module named 'json' is already imported from"):
        build_model(f"{path}:build_net", 3)


def test_hpctrain_run_exits_2_naming_the_file(tmp_path, tiny, run_cli):
    write(tmp_path, "nets_exit.py", "import torch\nimport no_such_dependency\n")
    code, _, err = run_cli("run", "default", *tiny(f"model.name={tmp_path}/nets_exit.py:x"))
    assert code == 2
    assert "nets_exit.py:x does not import: ModuleNotFoundError: No module named " \
        "'no_such_dependency' (at nets_exit.py:2)" in err
