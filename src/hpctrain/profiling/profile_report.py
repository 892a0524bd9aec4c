"""`hpctrain profile` outputs: which traces to read, the terminal report, profile.json and the
pictures, written next to the traces (atomically: a half-written report never replaces one).
"""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.config import current_names, flatten
from hpctrain.config.recipe import CUDA_GRAPH_MODES
from hpctrain.profiling.analysis import Evidence, analyse
from hpctrain.profiling.collect import collect
from hpctrain.profiling.picture import write_html, write_png
from hpctrain.profiling.trace import TraceError
from hpctrain.profiling.verdict import Settings, Verdict
from hpctrain.runs.directory import PROFILE, PROFILE_SUMMARY, RunDir
from hpctrain.writers import own_folder, write_whole

TRACE_PATTERNS = ("*.json.gz", "*.json")
OUTPUTS = (PROFILE_SUMMARY, "profile.html", "profile.png")


def find_traces(path: Path | str) -> list[Path]:
    """A trace file, a folder of traces (one per rank), or a run directory with profile/."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise TraceError(f"--trace {path}: no such file or folder")
    folder = path / PROFILE if (path / PROFILE).is_dir() else path
    found = sorted({p for pattern in TRACE_PATTERNS for p in folder.glob(pattern)
                    if p.name not in OUTPUTS and not p.name.startswith(".")})
    if not found:
        raise TraceError(f"--trace {path}: no trace files (*.json or *.json.gz) in {folder}; "
                         "record one with hpctrain profile RECIPE")
    return found


def analyse_traces(paths: list[Path]) -> list[Evidence]:
    """Each file's evidence, sorted by rank; two files of one rank are refused."""
    ranks = sorted((analyse(collect(path)) for path in paths), key=lambda e: e.rank)
    seen: dict[int, str] = {}
    for e in ranks:
        if e.rank in seen:
            raise TraceError(f"{seen[e.rank]} and {e.trace} are both rank {e.rank}: give one "
                             "profile's traces (one file per rank)")
        seen[e.rank] = e.trace
    return ranks


def settings_from_run(run_dir: Path | None, recipe: str | None = None) -> Settings:
    """The settings a recommendation should start from: the run's config.yaml, resolved by
    its summary.json where it says how ('auto' precision, compile, channels_last)."""
    from hpctrain.data.loader import resolve_num_workers, usable_cpus  # imports torch: late

    settings = Settings(recipe=recipe or "RECIPE", cores=usable_cpus())
    config = RunDir(run_dir).read_config() if run_dir is not None else None
    if config is None:
        return settings
    summary = RunDir(run_dir).read_summary() or {}
    system = summary.get("system") if isinstance(summary.get("system"), dict) else {}
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    settings.recipe = recipe or config.get("name", "RECIPE").removesuffix("-profile")
    settings.dataset = data.get("dataset")
    settings.decode = flatten(current_names(config)).get("data.images.decode")
    settings.num_workers = resolve_num_workers(data.get("num_workers", "auto"))
    settings.prefetch_factor = data.get("prefetch_factor")
    settings.precision = system.get("precision") or config.get("precision")
    settings.device_name = system.get("device_name")
    settings.mfu, settings.mfu_peak = summary.get("mfu"), summary.get("mfu_peak")
    # a switch the plan turned off for a reason (its note: FSDP, pipeline stages) is no advice
    settings.channels_last = None if system.get("note") else system.get("channels_last")
    settings.compile = system.get("compile")
    settings.cuda_graphs = system.get("compile_mode") in CUDA_GRAPH_MODES
    settings.batch_size = summary.get("batch_size_per_device")
    settings.strategy = summary.get("strategy")
    settings.log_every = config.get("train", {}).get("log_every")
    return settings


def text_report(ranks: list[Evidence], verdict: Verdict) -> str:
    """The terminal report: the step and its regions, the ranks side by side, the GPU's
    time, host synchronisation, matrix shapes, the top operators, then the verdict."""
    e = ranks[0]
    kind = "GPU trace" if e.gpu else "CPU-only trace"
    lines = [f"{len(ranks)} rank(s), {e.steps} active steps, {kind}",
             f"step {e.step_ms['mean']:.1f} ms (spread {e.step_ms['std']:.1f}, "
             f"{e.step_ms['min']:.1f}-{e.step_ms['max']:.1f})"]
    for name, r in e.regions.items():
        bar = "#" * round(r["share"] * 40)
        lines.append(f"  {name:<10} {r['mean_ms']:>9.2f} ms  {r['share']:>4.0%}  "
                     f"(spread {r['std_ms']:.2f})  {bar}")
    if len(ranks) > 1:
        lines.append("per rank: step ms / data wait / GPU busy / exposed communication")
        for r in ranks:
            busy = f"{1 - r.temporal['idle']:.0%}" if r.temporal else "-"
            comm = f"{r.communication['exposed_share']:.0%}" if r.communication else "-"
            lines.append(f"  rank {r.rank:<3} {r.step_ms['mean']:>9.2f}  "
                         f"{r.data_wait_share:>6.0%}  {busy:>6}  {comm:>6}")
    if e.gpu:
        lines += _gpu_lines(e)
    lines += _sync_and_shape_lines(e)
    lines.append("top operators (self time): " + ", ".join(
        f"{o['name']} {o['self_ms']:.1f} ms" for o in e.top_ops[:5]))
    if e.top_kernels:
        lines.append("top kernels: " + ", ".join(
            f"{k['name'][:50]} {k['ms']:.1f} ms" for k in e.top_kernels[:3]))
    if "mfu" in verdict.numbers:
        lines.append(f"MFU {verdict.numbers['mfu']:.1%} of the {verdict.numbers['mfu_peak']} "
                     "peak (hpctrain bench node measures this node's)")
    lines += ["", f"verdict: {verdict.bound.upper()}", f"  {verdict.reason}"]
    if verdict.recommendations:
        lines.append("recommendations, largest expected gain first:")
        lines += [f"  {i}. {r.line()}" for i, r in enumerate(verdict.recommendations, 1)]
    elif verdict.bound == "compute-bound" and e.gpu:
        lines.append("nothing to change in the settings: the GPU is busy doing matrix work "
                     "on Tensor Cores")
    return "\n".join(lines)


def _gpu_lines(e: Evidence) -> list[str]:
    """The GPU's time (compute, idle and why), launches, communication, Tensor Cores."""
    t, idle, launch = e.temporal, e.idle, e.launch
    lines = [f"GPU: compute {t['compute']:.0%}, non-compute {t['non_compute']:.0%} "
             f"(communication {t['communication']:.0%}, memory {t['memory']:.0%}), "
             f"idle {t['idle']:.0%}: host-wait {idle['host_wait']:.0%}, kernel-wait "
             f"{idle['kernel_wait']:.0%}, other {idle['other']:.0%} of idle",
             f"launches: {launch['kernels_per_step']:.0f} kernels/step, median "
             f"{launch['median_kernel_us']:.0f} us, {launch['short_kernel_share']:.0%} "
             "shorter than their launch; CPU launching "
             f"{launch['cpu_launch_ms_per_step']:.2f} ms/step vs GPU busy "
             f"{launch['gpu_busy_ms_per_step']:.2f} ms/step"]
    if e.communication:
        c = e.communication
        lines.append(f"communication: {c['share']:.0%} of the time, {c['overlap']:.0%} "
                     f"overlapped, {c['exposed_share']:.0%} exposed")
    tc = e.tensor_cores
    precisions = ", ".join(f"{k} {v:.0%}" for k, v in tc["precision"].items()) \
        or "no matrix kernels"
    lines.append(f"Tensor Cores: {tc['share_of_matrix_time']:.0%} of matrix kernel time "
                 f"({tc['matrix_ms_per_step']:.1f} ms/step; {precisions})")
    return lines


def _sync_and_shape_lines(e: Evidence) -> list[str]:
    """Where the host waited for the device (the top call sites), and the matrix operands
    that are not multiples of 8."""
    lines, sync = [], e.sync
    if sync["sites"]:
        if e.gpu:
            lines.append(f"host synchronisation: {sync['calls_per_step']:.1f} per step, "
                         f"{sync['ms_per_step']:.2f} ms/step")
        else:
            lines.append(f"host reads of tensors (.item() and the like; each waits for the "
                         f"device on a GPU): {sync['calls_per_step']:.1f} per step")
        for site in sync["sites"][:3]:
            caller = site.get("called_from")
            lines.append(f"  {site['call_site'] or '(no Python stack)'}  {site['op']}  "
                         f"x{site['calls']}  {site['ms']:.2f} ms"
                         + (f"  (a library's read, called from {caller})" if caller else ""))
    dims = e.matrix_dims
    if dims["offenders"]:
        lines.append(f"matrix operands not multiples of 8: {dims['share_of_matrix_time']:.0%} "
                     "of matrix operator time")
        for o in dims["offenders"][:3]:
            lines.append(f"  {o['op']} {o['shapes']} -> {o['dims_not_multiple_of_8']}")
    return lines


def write_reports(folder: Path, ranks: list[Evidence], verdict: Verdict, title: str,
                  text: str) -> dict[str, Path]:
    own_folder(folder)
    paths = {name: folder / name for name in OUTPUTS}
    document = {"title": title, "verdict": verdict.to_json(),
                "ranks": [e.to_json() for e in ranks]}
    write_whole(paths[PROFILE_SUMMARY], json.dumps(document, indent=2))
    write_html(paths["profile.html"], ranks[0], verdict, title, text)
    write_png(paths["profile.png"], ranks[0], verdict, title)
    return paths
