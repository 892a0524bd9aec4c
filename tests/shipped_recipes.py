"""The shipped recipes' own trainings (`hpctrain run`, `run tiny-lm`, `run pointnet` through the
installed console script, as the README gives them), whose accuracy the README promises.

They are the suite's three longest runs. Those a session needs train together, the cores shared
out between them (one torch thread each on two cores): on two cores the three took 295 s so, the
default's images generated first, against 354-382 s one after another at two threads each
(docs/benchmarks.md, issue 66's eighth session). What they prove is unchanged: the recipe as
shipped reaches its accuracy; the thread count changes only the order of a sum's terms. One
alone trains as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# the fixture that hands each recipe's run to its tests, and the recipe's name
FIXTURES = {"default_recipe_run": "default", "tiny_lm_recipe_run": "tiny-lm",
            "pointnet_recipe_run": "pointnet"}
TIMEOUT = 1500  # seconds for all of them together; each takes 2-5 minutes here


@dataclass
class Training:
    """One recipe's console-script run: its arguments, its output folder, and the summary it
    writes under it (`summary_glob`)."""

    args: list[str]
    out: Path
    summary_glob: str


def training(recipe: str, out: Path, default_shapes_cache: Path) -> Training:
    """The README's command for `recipe`: its output, and its data generated, under `out` (the
    default's images in the session's cache, which other tests read)."""
    if recipe == "default":
        return Training(["run", f"output_dir={out / 'runs'}",
                         f"data.shapes.cache_dir={default_shapes_cache}"],
                        out, "runs/default-*/summary.json")
    cache = {"tiny-lm": "data.arithmetic.cache_dir", "pointnet": "data.shapes3d.cache_dir"}
    return Training(["run", recipe, f"output_dir={out}", "run_name=recipe",
                     f"{cache[recipe]}={out / 'cache'}"], out, "recipe/summary.json")


def console_script() -> str:
    script = Path(sys.executable).with_name("hpctrain")
    return str(script) if script.exists() else "hpctrain"


def train_together(trainings: dict[str, Training]) -> dict[str, tuple]:
    """Start every training at once, each with its share of the cores, and wait for all:
    {recipe: (CompletedProcess, summary)}."""
    share = max(1, (os.cpu_count() or 1) // len(trainings)) if len(trainings) > 1 else None
    env = {**os.environ, "OMP_NUM_THREADS": str(share)} if share else None
    started = {}
    for recipe, one in trainings.items():
        one.out.mkdir(parents=True, exist_ok=True)
        command = [console_script(), *one.args]
        with open(one.out / "stdout", "w") as out, open(one.out / "stderr", "w") as err:
            started[recipe] = (command, subprocess.Popen(command, stdout=out, stderr=err,
                                                         stdin=subprocess.DEVNULL, env=env))
    deadline = time.monotonic() + TIMEOUT
    try:
        for _, process in started.values():
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for _, process in started.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=60)
    return {recipe: _ended(command, process, trainings[recipe])
            for recipe, (command, process) in started.items()}


def _ended(command: list[str], process: subprocess.Popen, training: Training) -> tuple:
    """(CompletedProcess, its summary or None where it wrote none)."""
    result = subprocess.CompletedProcess(command, process.returncode,
                                         (training.out / "stdout").read_text(),
                                         (training.out / "stderr").read_text())
    found = list(training.out.glob(training.summary_glob))
    return result, json.loads(found[0].read_text()) if len(found) == 1 else None


def summary_of(ended: tuple) -> tuple[subprocess.CompletedProcess, dict]:
    """A recipe's run that must have ended well: (CompletedProcess, summary)."""
    result, summary = ended
    assert result.returncode == 0 and summary is not None, result.stderr[-2000:]
    return result, summary
