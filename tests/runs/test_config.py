"""Recipes, overrides and the errors a user sees for a bad configuration: the tests that train,
in this process or in an `hpctrain` process of their own (the others are
tests/unit/test_config.py)."""

import subprocess
import sys

import pytest



@pytest.mark.parametrize("verb", ["run", "memory"])
def test_a_bad_recipe_is_told_before_torch_is_imported(verb):
    """A typo costs the third of a second the recipe takes to read, not the seconds torch
    takes to import (in a fresh interpreter: this one has torch already)."""
    probe = ("import sys; from hpctrain import cli; "
             f"code = cli.main(['{verb}', 'default', 'train.batch_size=abc']); "
             "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stderr[-2000:]
    assert "train.batch_size = 'abc'" in done.stderr


def test_a_value_in_an_error_is_shown_in_a_few_items_however_large(run_cli):
    """An error message never prints a value unbounded (issue 51): a list of 50,000 numbers or
    a string of a megabyte is shown in a few items and characters."""
    values = "[" + ", ".join(str(n) for n in range(50000)) + "]"
    code, _, err = run_cli("config", "show", "default", f"train.batch_size={values}")
    assert code == 2 and "train.batch_size = [0, 1, 2, 3, ...]" in err and len(err) < 600
    code, _, err = run_cli("config", "show", "default", "precision=" + "x" * 1_000_000)
    assert code == 2 and "precision = 'xxxxxxxxxxxx" in err and len(err) < 800, len(err)
