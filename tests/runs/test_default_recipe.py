"""The README's promise: `hpctrain run` on the built-in default reaches 95% validation
accuracy (in about 3 minutes on two CPU cores). Runs the installed console script."""

import pytest


@pytest.mark.slow
def test_default_recipe_reaches_95_percent(default_recipe_run):
    result, summary = default_recipe_run
    assert summary["status"] == "completed"
    assert summary["best_val_accuracy"] >= 0.95, summary
    assert "best_val_accuracy" in result.stdout
