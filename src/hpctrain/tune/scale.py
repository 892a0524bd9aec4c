"""`hpctrain scale`: which GPU count to ask for. The recipe runs for a fixed number of steps at
each size (torchrun here, or one Slurm job per size), each in its own run directory
(STUDY/gpus-N), and the study compares their steady throughput (the summary's, which leaves
out the first logging interval: start-up, compilation, the first batches).

Weak scaling (the default) keeps the batch per device, so the global batch grows with the
size; --strong keeps the global batch of one device and splits it. Efficiency is throughput
over N times one device's. The recommendation is the largest size whose efficiency stays at
or above the threshold, and what limits the next one, read from the runs themselves: the
data wait share, the slowest rank (the summary's straggler), or else the time the step spends
beyond one device's: communication and synchronisation.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpctrain.monitor import lifeline
from hpctrain.errors import ConfigError
from hpctrain.runs.directory import RunDir, stamp
from hpctrain.readers import FINITE, FLAG, TEXT, Kind, list_of, optional, whole
from hpctrain.tune.study import check_settings, read_settings
from hpctrain.tune.worker import hpctrain_run, torchrun
from hpctrain.writers import not_a_link, open_fresh, own_folder, write_png, write_whole

SETTINGS = "scale.json"
RESULT = "scale-result.json"
PICTURE = "scale.png"
DATA_BOUND = 0.2  # a data wait share from which the input pipeline is named as the limit


MOST_DEVICES = 1 << 20  # a size: more devices than any machine has
STUDY_RULES = {"recipe": optional(TEXT), "overrides": list_of(TEXT),
               "sizes": Kind("a list of 1 to 64 device counts", lambda v: isinstance(v, list)
                             and 0 < len(v) <= 64 and all(whole(1, MOST_DEVICES).holds(x)
                                                          for x in v)),
               "steps": whole(10, 10**9), "strong": FLAG,
               "threshold": Kind("a number above 0, at most 1", lambda v: FINITE.holds(v)
                                 and 0 < v <= 1)}


@dataclass
class Study:
    recipe: str | None
    overrides: list[str]
    sizes: list[int]
    steps: int
    strong: bool
    threshold: float

    def run_name(self, size: int) -> str:
        return f"gpus-{size}"

    def size_overrides(self, config, size: int) -> list[str]:
        """The overrides that make the recipe this size's run: the fixed steps, evaluation
        and checkpoints only at the end, and the batch the scaling mode keeps."""
        train = config.train
        per_device = train.global_batch_size // train.grad_accum_steps \
            if train.global_batch_size else train.batch_size
        batch = [f"train.global_batch_size={per_device * train.grad_accum_steps}"] \
            if self.strong else [f"train.batch_size={per_device}"]
        return [*batch, f"train.max_steps={self.steps}", "train.eval_every_epochs=1000000",
                f"train.log_every={max(1, min(train.log_every, self.steps // 5))}",
                "checkpoint.every_epochs=null", "checkpoint.every_steps=null",
                "report=false", "resume=auto"]


def prepare(recipe: str | None, overrides: list[str], sizes: list[int], steps: int,
            strong: bool, threshold: float, folder: str | None) -> tuple[Path, Study]:
    from hpctrain.config import load_config

    config = load_config(recipe, overrides)
    if sorted(set(sizes)) != sizes:
        raise ConfigError(f"--gpus {','.join(map(str, sizes))}: give increasing sizes, each "
                          "once, e.g. 1,2,4,8")
    if steps < 10:
        raise ConfigError(f"--steps {steps}: give 10 or more (the first logging interval is "
                          "left out of the throughput)")
    if not 0 < threshold <= 1:
        raise ConfigError(f"--threshold {threshold}: give an efficiency above 0, at most 1")
    study = Study(recipe, list(overrides), sizes, steps, strong, threshold)
    if strong:
        train = config.train
        global_batch = train.global_batch_size or train.batch_size * train.grad_accum_steps
        for size in sizes:
            if global_batch % (size * train.grad_accum_steps):
                raise ConfigError(f"--strong --gpus {size}: the global batch {global_batch} "
                                  f"does not split over {size} devices; choose sizes that "
                                  "divide it, or weak scaling (without --strong)")
    for size in sizes:  # each size's configuration is valid before anything runs
        load_config(recipe, [*overrides, *study.size_overrides(config, size)])
    place = Path(folder) if folder else \
        Path(config.output_dir) / f"{config.name}-scale-{stamp()}"
    place = place.expanduser().absolute()
    check_settings(study, STUDY_RULES, "the scaling study")
    own_folder(place)
    write_whole(place / SETTINGS, json.dumps(study.__dict__, indent=1) + "\n")
    return place, study


def read_study(folder: Path) -> Study:
    study = read_settings(folder, SETTINGS, Study, STUDY_RULES, "a scaling study",
                          "hpctrain scale RECIPE --gpus 1,2,4")
    if sorted(set(study.sizes)) != study.sizes:
        raise ConfigError(f"{Path(folder) / SETTINGS} is damaged: its sizes "
                          f"{study.sizes[:8]} do not increase; it is written by hpctrain")
    return study


def run_locally(folder: Path, study: Study, say=print) -> None:
    """Each size in turn under torchrun (one process per GPU, or per share of the cores
    without GPUs); a size that fails is said and left out."""
    from hpctrain.config import load_config

    config = load_config(study.recipe, study.overrides)
    for size in study.sizes:
        not_a_link(folder / study.run_name(size))  # each size's run stays in the study
        log = folder / f"{study.run_name(size)}.log"
        say(f"size {size}: {study.steps} steps ...")
        overrides = [*study.overrides, *study.size_overrides(config, size),
                     f"output_dir={folder}", f"run_name={study.run_name(size)}"]
        with open_fresh(log) as out:
            code = subprocess.call([*torchrun(size), *hpctrain_run(study.recipe, overrides)],
                                   stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL,
                                   env={**os.environ, **lifeline.environment()})
        if code != 0:
            say(f"size {size}: failed (exit {code}); see {log}")


def submit(folder: Path, study: Study, time_limit: str, cluster: str | None, **options):
    """One job per size (as `hpctrain submit` writes it), each into its run directory."""
    from hpctrain.cluster import jobs

    from hpctrain.cluster.profiles import get_profile
    from hpctrain.config import load_config

    config = load_config(study.recipe, study.overrides)
    profile = get_profile(cluster)
    planned = []
    for size in study.sizes:  # every size checked before the first is submitted
        where = [f"output_dir={folder}", f"run_name={study.run_name(size)}"]
        request, script = jobs.plan(study.recipe, [*study.overrides,
                                                   *study.size_overrides(config, size), *where],
                                    size, time_limit, cluster, **{**options, "job_name": None})
        jobs.check_fits(request, profile)
        planned.append((size, request, script))
    return [(size, jobs.send(request, script, profile).id) for size, request, script in planned]


def _row(study: Study, folder: Path, size: int, summary: dict | None) -> dict | None:
    """The size's figures from its run's summary (held to its rules as read: a NaN or a
    string throughput is damage, named by analyse), None before it completed."""
    if not summary or summary.get("status") != "completed" or not all(
            summary.get(key) for key in ("samples_per_second", "global_batch_size", "steps",
                                         "epochs")):
        return None
    throughput = summary["samples_per_second"]
    per_epoch = summary["global_batch_size"] * summary["steps"] / summary["epochs"]
    epoch_seconds = per_epoch / throughput
    per_joule = summary.get("samples_per_joule")
    straggler = summary.get("straggler") or {}
    return {"size": size, "samples_per_second": throughput,
            "step_seconds": summary["global_batch_size"] / throughput,
            "global_batch_size": summary["global_batch_size"],
            "epoch_seconds": epoch_seconds, "epoch_gpu_hours": epoch_seconds * size / 3600,
            "epoch_energy_kwh": per_epoch / per_joule / 3.6e6 if per_joule else None,
            "data_wait_fraction": summary.get("data_wait_fraction") or 0.0,
            "straggler": straggler or None, "device": summary.get("device"),
            "run_dir": str(folder / study.run_name(size))}


def analyse(folder: Path) -> dict:
    """The table, the recommendation and what limits the next size."""
    folder = Path(folder)
    study = read_study(folder)
    rows, damaged = [], {}
    for size in study.sizes:
        summary, why = RunDir(folder / study.run_name(size)).summary_and_damage()
        if why is not None:
            damaged[size] = why
        elif row := _row(study, folder, size, summary):
            rows.append(row)
    missing = [s for s in study.sizes if s not in {r["size"] for r in rows} | set(damaged)]
    base = next((r for r in rows if r["size"] == study.sizes[0]), None)
    for row in rows:
        if base is None:
            row["speedup"] = row["efficiency"] = None
            continue
        row["speedup"] = row["samples_per_second"] / base["samples_per_second"]
        row["efficiency"] = row["speedup"] * base["size"] / row["size"]
        # weak scaling: the step's time beyond the smallest size's is the price of the size
        row["overhead_fraction"] = max(0.0, 1 - base["step_seconds"] / row["step_seconds"]) \
            if not study.strong else max(0.0, 1 - row["efficiency"])
    good = [r for r in rows if r.get("efficiency") is not None and
            r["efficiency"] >= study.threshold]
    pick = good[-1] if good else None
    after = next((r for r in rows if pick and r["size"] > pick["size"]), None)
    result = {"folder": str(folder), "recipe": study.recipe, "mode": "strong" if study.strong
              else "weak", "steps": study.steps, "threshold": study.threshold, "rows": rows,
              "missing": missing, "damaged": damaged, "recommended": pick["size"] if pick else None,
              "limit": _limit(after, base) if after else None}
    if rows and base is not None:
        _picture(rows, study, folder / PICTURE)
        result["picture"] = str(folder / PICTURE)
    write_whole(folder / RESULT, json.dumps(result, indent=1) + "\n")
    return result


def _limit(row: dict, base: dict) -> str:
    """What keeps `row` (the first size below the threshold) from scaling."""
    if row["device"] == "cpu":  # torch's threads already used every core at one process
        return (f"no GPUs: the {row['size']} processes share this machine's CPU cores, which "
                "one process already used; a study without GPUs measures core sharing, not "
                "devices")
    wait, base_wait = row["data_wait_fraction"], base["data_wait_fraction"]
    if wait >= DATA_BOUND and wait > base_wait + 0.05:
        return (f"the input pipeline: at {row['size']} devices the step waits for data "
                f"{wait:.0%} of the time (hpctrain bench data RECIPE)")
    straggler = row.get("straggler") or {}
    ratio = straggler.get("ratio_to_median") or 1.0
    if ratio >= 1.1:
        return (f"the slowest rank (rank {straggler['rank']} on {straggler['host']}) takes "
                f"{ratio - 1:.0%} longer per step than the median rank: the others wait for "
                "it at every step")
    return (f"communication and synchronisation: at {row['size']} devices "
            f"{row['overhead_fraction']:.0%} of the step is time beyond one device's step "
            "(gradient all-reduce not hidden behind the backward pass; hpctrain profile)")


def _picture(rows: list[dict], study: Study, path: Path) -> None:
    from PIL import Image

    from hpctrain.report import chart

    sizes = [r["size"] for r in rows]
    rate = chart.Chart("throughput (samples/s) against devices", "devices", [
        chart.Line("measured", chart.PALETTE[0],
                   [(r["size"], r["samples_per_second"], f"{r['size']}: "
                     f"{r['samples_per_second']:,.0f}/s") for r in rows]),
        chart.Line("ideal", chart.PALETTE[7],
                   [(s, rows[0]["samples_per_second"] * s / sizes[0], "ideal") for s in sizes],
                   dashed=True)])
    efficiency = chart.Chart(f"scaling efficiency ({'strong' if study.strong else 'weak'}), "
                             f"threshold {study.threshold:g}", "devices", [
        chart.Line("efficiency", chart.PALETTE[1],
                   [(r["size"], r["efficiency"], f"{r['efficiency']:.2f}") for r in rows]),
        chart.Line("threshold", chart.PALETTE[8],
                   [(s, study.threshold, "threshold") for s in sizes], dashed=True)])
    left, right = chart.image(rate), chart.image(efficiency)
    both = Image.new("RGB", (left.width + right.width, left.height), "white")
    both.paste(left, (0, 0))
    both.paste(right, (left.width, 0))
    write_png(path, both)


def text(result: dict) -> str:
    lines = [f"scaling study {result['folder']}: {result['recipe'] or 'default'}, "
             f"{result['mode']} scaling, {result['steps']} steps per size",
             f"{'devices':>8}{'samples/s':>12}{'speedup':>9}{'efficiency':>12}"
             f"{'epoch':>10}{'GPU-h/epoch':>13}{'kWh/epoch':>11}{'data wait':>11}"]
    for r in result["rows"]:
        kwh = f"{r['epoch_energy_kwh']:.3g}" if r["epoch_energy_kwh"] is not None else "-"
        speedup = f"{r['speedup']:.2f}" if r["speedup"] is not None else "-"
        efficiency = f"{r['efficiency']:.2f}" if r["efficiency"] is not None else "-"
        lines.append(f"{r['size']:>8}{r['samples_per_second']:>12,.1f}{speedup:>9}"
                     f"{efficiency:>12}{_clock(r['epoch_seconds']):>10}"
                     f"{r['epoch_gpu_hours']:>13.3g}{kwh:>11}{r['data_wait_fraction']:>11.0%}")
    for size, why in result["damaged"].items():
        lines.append(f"size {size}: its {why}; left out")
    if result["missing"]:
        lines.append(f"no result for {', '.join(map(str, result['missing']))} device(s): "
                     "still running, or failed (see the run directories and their logs)")
    if result["recommended"] is not None:
        lines.append(f"recommended: {result['recommended']} device(s), the largest size with "
                     f"efficiency >= {result['threshold']:g}")
    else:
        lines.append("no recommendation: no size reached the threshold"
                     + ("" if result["rows"] else " (no size has finished)"))
    if result["limit"]:
        lines.append(f"what limits the next size: {result['limit']}")
    if result.get("picture"):
        lines.append(f"picture: {result['picture']}")
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"

