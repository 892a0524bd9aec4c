"""The README's promise: `hpctrain run` on the built-in default reaches 95% validation
accuracy (in about 3 minutes on two CPU cores). Runs the installed console script."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_default_recipe_reaches_95_percent(tmp_path, default_shapes_cache):
    cache = default_shapes_cache
    script = Path(sys.executable).with_name("hpctrain")
    command = [str(script) if script.exists() else "hpctrain", "run",
               f"output_dir={tmp_path / 'runs'}", f"data.shapes.cache_dir={cache}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    summary_file, = (tmp_path / "runs").glob("default-*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "completed"
    assert summary["best_val_accuracy"] >= 0.95, summary
    assert "best_val_accuracy" in result.stdout
