"""User code in recipes: the tests that need no training run, no process and no server (the
others are tests/runs/test_user_code.py)."""

from __future__ import annotations

import itertools

import pytest
import torch

from hpctrain.config import load_config
from hpctrain.errors import ConfigError
from hpctrain.models.model_names import build_model
from user_nets import NETS, write

pytestmark = pytest.mark.usefixtures("forget_user_modules")  # each test's files: fresh modules


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


class Numbers(torch.utils.data.IterableDataset):
    """0..23 as 4 files of 6, shared out by file (hpctrain.shard) or not at all."""

    def __init__(self, by_file: bool):
        self.by_file = by_file

    def __iter__(self):
        import hpctrain

        if not self.by_file:
            yield from range(24)
            return
        for piece in hpctrain.shard(range(4)):
            yield from range(6 * piece, 6 * piece + 6)


@pytest.mark.parametrize("by_file", [True, False])
def test_the_processes_of_a_run_read_disjoint_shares_of_a_stream(by_file):
    from hpctrain.data.streams import Stream

    shares = [set(itertools.islice(Stream(Numbers(by_file), "numbers", rank, 2, 1), 12))
              for rank in (0, 1)]
    assert shares[0].isdisjoint(shares[1]) and shares[0] | shares[1] == set(range(24))
    assert (shares[0] == {0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17}) == by_file


def test_an_unknown_builtin_dataset_name_is_explained(run_cli):
    code, _, err = run_cli("run", "default", "data.dataset=shape")
    assert code == 2 and "did you mean 'shapes'?" in err and "path/to/file.py:make" in err


@pytest.mark.parametrize("override, message", [
    ("task.loss=cross_entropy", "task.loss = 'cross_entropy': Value error, expected your own "
     "function"),
    ("task.metrics.accuracy=m.py:f", "metric name 'accuracy': use a Python identifier other "
     "than loss, accuracy"),
])
def test_loss_and_metric_settings_are_checked(run_cli, override, message):
    code, _, err = run_cli("run", "default", override)
    assert code == 2 and message in err, err
