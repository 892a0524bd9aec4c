"""The `hpctrain runs` verbs: where the GPU-hours and the energy went. Parsing and printing
only; the index is runs/index.py. Each verb first refreshes the index from the output
directories (runs/scan.py), so what it shows is what the run directories say now."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain.cli.arguments import make_verb
from hpctrain.errors import ConfigError

RUNS_EXAMPLE = """examples:
  hpctrain runs                                   # every run, newest first
  hpctrain runs --recipe imagenet-resnet50 --status failed --since 7d
  hpctrain runs show imagenet-resnet50-20261124-101500
  hpctrain runs compare RUN_A RUN_B               # settings that differ, figures side by side
  hpctrain runs usage --by user                   # GPU-hours, kWh, runs, failed share
  hpctrain runs leaderboard small-images --target best_val_accuracy=0.94
  hpctrain runs --db postgresql://hpctrain@dbhost/runs   # a team's index (or HPCTRAIN_DB)

Runs are found in the output directories runs were written to (remembered at each start),
the run directories of submitted jobs, ./runs, and every --root DIR given once.
"""

REPORT_EXAMPLE = """examples:
  hpctrain report runs/default-20261124-101500     # writes runs/.../report.html and PNGs
  hpctrain report rn50 rn50-lars rn50-lamb --out compare.html   # three runs overlaid

One HTML file that opens offline (no network: style, script and charts inline): loss,
accuracy or perplexity, learning rate, throughput, data wait and GPU use against step or
wall time, restarts marked; the summary, the configuration (several runs: what differs),
software, Slurm jobs and the profile's verdict. Every finished run writes its own
(report=false turns it off).
"""

WATCH_EXAMPLE = """examples:
  hpctrain watch 123456                 # a submitted job: follows its continuations too
  hpctrain watch runs/default-20261124-101500 --every 10
  hpctrain watch rn50 --once --json     # one reading, for scripts

Reads the run directory (metrics.jsonl, summary.json) over the shared file system; for a job,
asks Slurm where it stands. Ends when the run completes or fails (a preempted run that is
requeued is followed on), or at Ctrl-C.
"""

TOP_EXAMPLE = """examples:
  hpctrain top                 # refreshes every 2 s until Ctrl-C; from a login node
  hpctrain top --once --json   # one reading, for scripts

Reads the run directories over the shared file system: the newest "gpu" record of each
running run's metrics.jsonl (written at every logging interval), no daemon on the nodes.
"""


def add_verbs(verbs) -> None:
    """The runs index's verbs, the report, watch, top and goodput, each beside its
    handler."""
    for add in (_add_runs, _add_report, _add_watch, _add_top, _add_goodput):
        add(verbs)


def _add_goodput(verbs) -> None:
    goodput = make_verb(verbs, "goodput", "where a run's device-seconds went: training, "
                        "data wait, evaluation, checkpoints, start-up, work lost to stops, "
                        "against the scheduler's accounting where it keeps one",
                        "examples:\n  hpctrain goodput runs/default-20261127-101500\n"
                        "  hpctrain goodput rn50 --json\n"
                        "  hpctrain goodput 123456    (a job you submitted, or one of its "
                        "chain)", cmd_goodput)
    goodput.add_argument("run", help="run folder, its name or id in the runs index, or the id "
                         "of a job submitted with hpctrain submit")
    goodput.add_argument("--db", help="the runs index where RUN is a name or id")
    goodput.add_argument("--json", action="store_true")


def cmd_goodput(args) -> int:
    from hpctrain.cluster.jobs import allocations
    from hpctrain.runs.goodput import DESCRIBED, SCHEDULER, account
    from hpctrain.runs.identity import read_identity

    folder = _goodput_folder(args.run, args.db)
    record, damage = read_identity(folder)
    if record is None:
        raise ConfigError(f"{folder}: {damage or 'no run.json: not a run directory of hpctrain'}")
    job_ids = sorted({s["job_id"] for s in record["starts"] if s.get("job_id")})
    made = account(record, allocations(job_ids) if job_ids else None)
    if args.json:
        print(json.dumps({"run": str(folder), **made.as_dict()}, indent=2))
        return 0
    table = Table(title=f"{folder}: {made.jobs} job(s), {made.allocated:,.1f} device-seconds "
                        f"({made.allocated / 3600:.4f} device-hours), from {made.source}")
    for column in ("where", "device-seconds", "share"):
        table.add_column(column, justify="left" if column == "where" else "right")
    for phase, seconds in made.phases.items():
        if phase == "unrecorded" and made.source != SCHEDULER:
            continue  # nothing to compare the records with
        table.add_row(DESCRIBED[phase], f"{seconds:,.1f}",
                      f"{seconds / made.allocated:.1%}" if made.allocated else "-")
    Console(width=100).print(table)
    print(f"goodput {made.goodput:.1%}" if made.goodput is not None else "goodput -",
          f"(training steps over allocated); {made.redone_steps} steps redone after stops;",
          f"{made.between_jobs:,.1f} s between jobs (queue, requeue: no device held)")
    if made.scheduler is not None:
        print(f"  the scheduler counts {made.scheduler:,.1f} device-seconds for jobs "
              f"{', '.join(job_ids)}; the run's own records {made.recorded:,.1f}")
    elif job_ids:
        print(f"  jobs {', '.join(job_ids)}: no scheduler accounting to read here (none "
              "kept, or its command absent): the run's own records alone")
    if made.unaccounted_jobs:
        print(f"  {made.unaccounted_jobs} job(s) left no seconds (written by an older "
              "hpctrain): not in the figures")
    return 0


def _goodput_folder(reference: str, db: str | None) -> Path:
    """The run of `reference`: a folder, a name or id in the runs index, or a job id that
    hpctrain submitted (any job of its chain)."""
    if re.fullmatch(r"\d+(_\d+)?", reference) and not Path(reference).is_dir():
        from hpctrain.cluster.jobs import Job

        run_dir = Job(reference).run_dir
        if run_dir is None:
            raise ConfigError(f"job {reference}: not one that hpctrain submitted from this "
                              "account (no run directory remembered): give its run folder")
        return run_dir
    return _run_folder(reference, db)


def _common(parser) -> None:
    parser.add_argument("--db", help="postgresql://... or an SQLite path (default: "
                        "HPCTRAIN_DB, else ~/.local/share/hpctrain/runs.sqlite)")
    parser.add_argument("--root", action="append", default=[], metavar="DIR",
                        help="an output directory to index (remembered)")
    parser.add_argument("--no-refresh", action="store_true",
                        help="read the index as it is, without scanning")
    parser.add_argument("--rescan", action="store_true",
                        help="check every run's files, finished ones too, in every folder "
                        "(also those whose time says nothing changed)")
    parser.add_argument("--json", action="store_true")


def _roots(args) -> list[Path]:
    """Every output directory known: remembered at each run's start, those of submitted jobs,
    ./runs, and --root (remembered from now on)."""
    from hpctrain.runs.directory import known_output_dirs, read_ledger, remember_output_dir

    given = []
    for root in args.root:
        folder = Path(root).expanduser().absolute()
        if not folder.is_dir():
            raise ConfigError(f"--root {root}: no such folder")
        remember_output_dir(folder)
        given.append(folder)
    roots = {Path(p) for p in known_output_dirs()} | set(given)
    roots |= {Path(row["run_dir"]).parent for row in read_ledger()}
    if Path("runs").is_dir():
        roots.add(Path("runs").absolute())
    return sorted(r for r in roots if r.is_dir())


def _index(args):
    """The index, refreshed from every output directory known (unless --no-refresh)."""
    from hpctrain.runs.database import open_database
    from hpctrain.runs.index import Index

    index = Index(open_database(args.db or os.environ.get("HPCTRAIN_DB")))
    if index.db.read_only and not args.no_refresh:
        print(f"hpctrain: note: the runs index {index.db.where} is read-only: shown as it "
              "is, not refreshed from the run folders", file=sys.stderr)
        args.no_refresh = True
    roots = _roots(args)
    if not args.no_refresh:
        index.refresh(roots, rescan=args.rescan)
    return index


def _run_folder(reference: str, db: str | None) -> Path:
    """A run directory given as a folder, or by its name or id in the runs index (read as it
    is: no scan)."""
    folder = Path(reference).expanduser()
    if folder.is_dir():
        return folder.absolute()
    from hpctrain.runs.database import open_database
    from hpctrain.runs.index import Index

    return Path(Index(open_database(db or os.environ.get("HPCTRAIN_DB"))).find(reference)["path"])


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([dhm])", text.strip())
    if match:
        seconds = float(match.group(1)) * {"d": 86400, "h": 3600, "m": 60}[match.group(2)]
        return time.time() - seconds
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ConfigError(f"--since {text}: give 7d, 12h, 30m or a date such as "
                          "2026-11-01") from None


def _plain(row: dict, full: bool = False) -> dict:
    out = {k: v for k, v in row.items() if k not in ("summary", "config", "signature")}
    out["jobs"] = json.loads(row["jobs"] or "[]")
    if full:
        out["summary"] = json.loads(row["summary"] or "{}")
        out["config"] = json.loads(row["config"] or "{}")
    return out


def _when(seconds) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds)) if seconds else "-"


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


LISTING_LIMIT = 50  # the runs `hpctrain runs` lists unless --limit says otherwise


def _add_runs(verbs) -> None:
    """`hpctrain runs` and its actions' arguments."""
    runs = make_verb(verbs, "runs", "the runs index: list, show, compare, usage, leaderboard",
                     RUNS_EXAMPLE, cmd_runs)
    _common(runs)
    runs.add_argument("--recipe")
    runs.add_argument("--status", help="completed, failed, preempted, running, lost, ...")
    runs.add_argument("--user")
    runs.add_argument("--since", help="7d, 12h, or a date (2026-11-01)")
    runs.add_argument("--limit", type=int, default=LISTING_LIMIT,
                      help=f"the newest N runs (default {LISTING_LIMIT}; 0: every run)")
    actions = runs.add_subparsers(dest="runs_verb", metavar="ACTION")
    show = make_verb(actions, "show", "one run: its row, jobs and summary",
                     "example:\n  hpctrain runs show RUN", cmd_runs_show)
    show.add_argument("run", help="run id, run folder name or path")
    _common(show)
    compare = make_verb(actions, "compare", "runs side by side: settings that differ, figures",
                        "example:\n  hpctrain runs compare RUN_A RUN_B", cmd_runs_compare)
    compare.add_argument("runs", nargs="+", metavar="RUN")
    _common(compare)
    usage = make_verb(actions, "usage", "GPU-hours, kWh, runs and failed share per group",
                      "example:\n  hpctrain runs usage --by month", cmd_runs_usage)
    usage.add_argument("--by", choices=["user", "recipe", "cluster", "month"], default="user")
    _common(usage)
    board = make_verb(actions, "leaderboard", "the race to a target: time, GPU-hours and "
                      "energy to reach it", "example:\n  hpctrain runs leaderboard "
                      "small-images --target best_val_accuracy=0.94", cmd_runs_leaderboard)
    board.add_argument("recipe")
    board.add_argument("--target", required=True, metavar="METRIC=VALUE")
    _common(board)
    sync = make_verb(actions, "sync", "send a run's offline trackers on: W&B offline runs "
                     "through wandb sync, the MLflow run to a tracking server",
                     "examples:\n  hpctrain runs sync rn50                      # wandb sync\n"
                     "  hpctrain runs sync rn50 --mlflow-uri http://mlflow.example:5000",
                     cmd_runs_sync)
    sync.add_argument("run", help="run id, run folder name or path")
    sync.add_argument("--mlflow-uri", help="copy the run's MLflow run there")
    sync.add_argument("--no-wandb", action="store_true", help="leave the W&B runs unsent")
    sync.add_argument("--dry-run", action="store_true", help="say what would be sent")
    _common(sync)


def cmd_runs(args) -> int:
    index = _index(args)
    if args.limit < 0:
        raise ConfigError(f"--limit {args.limit}: give a number of runs, or 0 for every run")
    rows = index.runs(args.recipe, args.status, args.user, _since(args.since),
                      args.limit + 1 if args.limit else None)
    more = bool(args.limit) and len(rows) > args.limit
    rows = rows[:args.limit] if more else rows
    if args.json:
        print(json.dumps([_plain(r) for r in rows], indent=2))
        return 0
    shown = f"the newest {len(rows)} runs (more: --limit N, or 0 for every run)" if more \
        else f"{len(rows)} run(s)"
    table = Table(title=f"{shown} in {index.db.where}")
    for column in ("run", "recipe", "status", "user", "started", "GPUs", "device-h", "kWh",
                   "goodput", "best"):
        table.add_column(column, justify="right" if column in ("GPUs", "device-h", "kWh",
                                                               "goodput") else "left")
    for r in rows:
        best = f"{r['best_metric'].removeprefix('best_')} {r['best_value']:.4g}" \
            if r["best_metric"] else "-"
        gpus = f"{r['gpu_count']} x {r['gpu_model']}" if r["gpu_count"] else \
            ("cpu" if r["gpu_count"] == 0 else "-")
        table.add_row(r["name"], r["recipe"], r["status"] + (" !" if r["problem"] else ""),
                      r["user_name"] or "-", _when(r["started"]), gpus,
                      _num(r["device_hours"], "{:.3f}"),
                      _num(r["energy_joules"] and r["energy_joules"] / 3.6e6, "{:.3f}"),
                      _num(r["goodput"], "{:.0%}"), best)
    Console(width=160).print(table)
    problems = [r for r in rows if r["problem"]]
    for r in problems:
        print(f"  ! {r['path']}: {r['problem']}")
    return 0


def cmd_runs_show(args) -> int:
    row = _plain(_index(args).find(args.run), full=True)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    for key, value in row.items():
        if key in ("summary", "config"):
            continue
        if key in ("started", "ended", "heartbeat"):
            value = _when(value)
        print(f"{key:>14}  {value if value is not None else '-'}")
    print("summary:")
    for key, value in row["summary"].items():
        if not isinstance(value, (dict, list)):
            print(f"  {key:>24}  {value}")
    return 0


def cmd_runs_compare(args) -> int:
    from hpctrain.config import flatten

    if len(args.runs) < 2:
        raise ConfigError("runs compare: give two runs or more")
    index = _index(args)
    rows = [_plain(index.find(reference), full=True) for reference in args.runs]
    configs = [flatten(r["config"]) for r in rows]
    keys = sorted(set().union(*configs))
    differ = {k: [c.get(k) for c in configs] for k in keys
              if k not in ("run_name", "resume", "output_dir")
              and len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1}
    figures = ("status", "best_val_accuracy", "best_val_loss", "images_per_second",
               "tokens_per_second", "data_wait_fraction", "wall_seconds", "device_hours",
               "energy_kwh", "samples_per_joule", "gpu_utilization_mean", "steps", "device",
               "world_size", "precision")
    side = {k: [r["summary"].get(k) for r in rows] for k in figures
            if any(r["summary"].get(k) is not None for r in rows)}
    if args.json:
        print(json.dumps({"runs": [r["path"] for r in rows], "settings": differ,
                          "figures": side}, indent=2))
        return 0
    for title, values in (("settings that differ", differ), ("figures", side)):
        table = Table(title=title)
        table.add_column("")
        for r in rows:
            table.add_column(r["name"])
        for key, cells in values.items():
            table.add_row(key, *["-" if c is None else f"{c:.4g}" if isinstance(c, float)
                                 else str(c) for c in cells])
        Console(width=160).print(table)
    return 0


def cmd_runs_usage(args) -> int:
    rows = _index(args).usage(args.by)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"usage by {args.by}")
    for column in (args.by, "runs", "GPU-hours", "device-hours", "kWh", "failed", "goodput"):
        table.add_column(column, justify="left" if column == args.by else "right")
    for r in rows:
        table.add_row(str(r["key"] or "-"), str(r["runs"]), _num(r["gpu_hours"], "{:.2f}"),
                      _num(r["device_hours"], "{:.2f}"), _num(r["kwh"], "{:.2f}"),
                      f"{r['failed_share']:.0%}", _num(r["goodput"], "{:.0%}"))
    Console(width=160).print(table)
    return 0


def parse_target(text: str) -> tuple[str, float, bool]:
    """'best_val_accuracy=0.94' -> ('val_accuracy', 0.94, higher is better)."""
    name, sep, value = text.partition("=")
    try:
        target = float(value)
    except ValueError:
        target = None
    if not sep or target is None:
        raise ConfigError(f"--target {text}: write METRIC=VALUE, e.g. "
                          "best_val_accuracy=0.94 or val_loss=2.5")
    metric = re.sub(r"^(best_|final_)", "", name.strip())
    if not metric.startswith("val_"):
        metric = f"val_{metric}"
    higher = not any(word in metric for word in ("loss", "perplexity", "error"))
    return metric, target, higher


def cmd_runs_leaderboard(args) -> int:
    metric, target, higher = parse_target(args.target)
    board = _index(args).leaderboard(args.recipe, metric, target, higher)
    if args.json:
        print(json.dumps({"metric": metric, "target": target, "higher_is_better": higher,
                          **board}, indent=2))
        return 0
    table = Table(title=f"{args.recipe}: {metric} {'>=' if higher else '<='} {target}")
    for column in ("#", "run", "user", "GPUs", "step", "time", "GPU-hours", "kWh", metric):
        table.add_column(column, justify="left" if column in ("run", "user", "GPUs") else
                         "right")
    for place, r in enumerate(board["reached"], 1):
        table.add_row(str(place), r["name"], r["user_name"] or "-",
                      f"{r['gpu_count']} x {r['gpu_model']}" if r["gpu_count"] else "cpu",
                      str(r["step"]), _num(r["elapsed_seconds"], "{:,.0f} s"),
                      _num(r["device_hours"], "{:.3f}"),
                      _num(r["energy_joules"] and r["energy_joules"] / 3.6e6, "{:.3f}"),
                      f"{r['value']:.4g}")
    Console(width=160).print(table)
    if board["missed"]:
        print("did not reach it: " + ", ".join(f"{r['name']} (best {r['best']:.4g})"
                                               for r in board["missed"]))
    return 0


def _top_table(index, everyone: bool) -> tuple[Table, list[dict]]:
    import getpass

    from hpctrain.runs.live import rank_rows

    user = None if everyone else getpass.getuser()
    runs = index.runs(status="running", user=user)
    table = Table(title=f"{len(runs)} running run(s)" + ("" if everyone else f" of {user}")
                  + time.strftime("  %H:%M:%S"))
    for column in ("run", "rank", "step", "GPU util", "memory", "power", "step time",
                   "data wait", "age"):
        table.add_column(column, justify="left" if column == "run" else "right")
    rows = []
    for run in runs:
        for rank in rank_rows(Path(run["path"])):
            rows.append({"run": run["name"], "path": run["path"], **rank})
            table.add_row(
                run["name"], str(rank["rank"]), str(rank["step"] or "-"),
                _num(rank["utilization"], "{:.0%}"),
                _num(rank["memory_used_bytes"] and rank["memory_used_bytes"] / 2**30,
                     "{:.1f} GiB"),
                _num(rank["power_watts"], "{:.0f} W"),
                _num(rank["step_seconds"] and rank["step_seconds"] * 1e3, "{:.0f} ms"),
                _num(rank["data_wait_fraction"], "{:.0%}"),
                _num(rank["time"] and time.time() - rank["time"], "{:.0f} s"))
    return table, rows


def _add_top(verbs) -> None:
    """`hpctrain top`'s arguments."""
    top = make_verb(verbs, "top", "your running runs, live: per rank GPU use, memory, power, "
                    "step time, data wait", TOP_EXAMPLE, cmd_top)
    top.add_argument("--all", action="store_true", help="every user's runs, not only yours")
    top.add_argument("--every", type=float, default=2.0, metavar="SECONDS")
    top.add_argument("--once", action="store_true", help="print one table and exit")
    _common(top)


def cmd_top(args) -> int:
    index = _index(args)
    if args.once or args.json:
        table, rows = _top_table(index, args.all)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            Console(width=160).print(table)
        return 0
    from rich.live import Live

    with Live(_top_table(index, args.all)[0], refresh_per_second=1) as live:
        try:
            while True:
                time.sleep(args.every)
                if not args.no_refresh:
                    index.refresh(_roots(args))
                live.update(_top_table(index, args.all)[0])
        except KeyboardInterrupt:
            pass
    return 0


def _add_report(verbs) -> None:
    """`hpctrain report`'s arguments."""
    report = make_verb(verbs, "report", "one offline HTML page of one or several runs: curves, "
                       "summary, configuration", REPORT_EXAMPLE, cmd_report)
    report.add_argument("runs", nargs="+", metavar="RUN",
                        help="a run directory, or a run's name or id in the runs index")
    report.add_argument("--out", metavar="FILE", help="the page (default: RUN/report.html "
                        "for one run, ./report.html for several); PNGs go beside it")
    report.add_argument("--db", help="the runs index that names RUN (as for hpctrain runs)")
    report.add_argument("--json", action="store_true", help="print the files written")


def cmd_report(args) -> int:
    from hpctrain.report.page import write
    from hpctrain.report.series import read_run

    folders = [_run_folder(reference, args.db) for reference in args.runs]
    runs = [read_run(folder) for folder in folders]
    for run in runs:  # the page says it too, beside the run
        for damage in run.damage:
            print(f"hpctrain: warning: {run.path}: {damage}; left out of the report",
                  file=sys.stderr)
    if not any(run.panels or run.summary for run in runs):
        raise ConfigError(f"{', '.join(map(str, folders))}: no metrics.jsonl or summary.json "
                          "there; give run directories (where config.yaml and metrics.jsonl "
                          "are)")
    out = Path(args.out) if args.out else (folders[0] / "report.html" if len(folders) == 1
                                           else Path("report.html"))
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give the page's file, e.g. "
                          f"{out / 'report.html'}")
    try:
        written = write(runs, out.absolute())
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot write the report there "
                          f"({err.strerror or err}); give a path in a writable folder") \
            from None
    if args.json:
        print(json.dumps([str(p) for p in written], indent=2))
    else:
        print("\n".join(str(p) for p in written))
    return 0


def _watched(args):
    """(run directory, Slurm job or None) that RUN|JOB names."""
    if args.run.isdigit():
        from hpctrain.cluster.jobs import Job

        job = Job(args.run)
        if job.run_dir is None:
            raise ConfigError(f"job {args.run}: not in the job ledger (not submitted with "
                              "hpctrain submit from this account); give its run directory")
        return job.run_dir, job
    return _run_folder(args.run, args.db), None


def _watch_view(shot) -> str:
    done = f"step {shot.step}" + (f"/{shot.total_steps}" if shot.total_steps else "")
    eta = f", ETA {shot.eta_seconds / 60:,.1f} min" if shot.eta_seconds is not None else ""
    lines = [f"{shot.run_dir}",
             f"  {shot.status}" + (f" (Slurm: {shot.slurm_state})" if shot.slurm_state else "")
             + f", {done}{eta}" + (f", last record {shot.age_seconds:,.0f} s ago"
                                   if shot.age_seconds is not None else "")]
    if shot.loss is not None:
        lines.append(f"  loss {shot.loss:.4f}  {shot.loss_spark}")
    if shot.throughput is not None:
        lines.append(f"  samples/s {shot.throughput:,.1f}  {shot.throughput_spark}")
    extra = [f"data wait {shot.data_wait:.0%}" if shot.data_wait is not None else "",
             f"GPU {shot.gpu_utilization:.0%}" if shot.gpu_utilization is not None else "",
             *[f"{k} {v:.4g}" for k, v in shot.val.items() if isinstance(v, (int, float))]]
    if any(extra):
        lines.append("  " + "  ".join(e for e in extra if e))
    if shot.damage:
        lines.append(f"  damaged: {shot.damage}")
    return "\n".join(lines)


def _add_watch(verbs) -> None:
    """`hpctrain watch`'s arguments."""
    watch = make_verb(verbs, "watch", "follow one run or job: latest figures, sparklines, ETA, "
                      "Slurm state; ends when the run does", WATCH_EXAMPLE, cmd_watch)
    watch.add_argument("run", metavar="RUN|JOB", help="a run directory, a run's name or id, "
                       "or a Slurm job id")
    watch.add_argument("--every", type=float, default=5.0, metavar="SECONDS")
    watch.add_argument("--once", action="store_true", help="print one reading and exit")
    watch.add_argument("--db", help="the runs index that names RUN (as for hpctrain runs)")
    watch.add_argument("--json", action="store_true")


def cmd_watch(args) -> int:
    from dataclasses import asdict

    from hpctrain.runs.watch import snapshot

    run_dir, job = _watched(args)

    def look():
        shot = snapshot(run_dir)
        if job is not None:
            from hpctrain.cluster.records import FINAL_STATES

            shot.slurm_state = job.state
            if shot.slurm_state.split()[0] in FINAL_STATES and shot.status == "running":
                shot.status = "failed"  # the job is over, the run never wrote its end
        return shot

    shot = look()
    if args.once or args.json or shot.ended:
        print(json.dumps(asdict(shot), indent=2) if args.json else _watch_view(shot))
        return 0
    from rich.live import Live

    with Live(_watch_view(shot), refresh_per_second=1) as live:
        try:
            while not shot.ended:
                time.sleep(args.every)
                shot = look()
                live.update(_watch_view(shot))
        except KeyboardInterrupt:
            pass
    return 0


def cmd_runs_sync(args) -> int:
    from hpctrain.report.sync import copy_mlflow, sync_wandb
    from hpctrain.report.trackers import mlflow_uri
    from hpctrain.runs.directory import RunDir

    if not Path(args.run).expanduser().is_dir():
        _index(args)  # a name or an id: refreshed first, as the other runs verbs do
    run_dir = _run_folder(args.run, args.db)
    done = {"run_dir": str(run_dir),
            "wandb": [] if args.no_wandb else sync_wandb(run_dir, args.dry_run)}
    if args.mlflow_uri:
        tracking = (RunDir(run_dir).read_config() or {}).get("tracking") or {}
        source = mlflow_uri(tracking.get("mlflow_uri"), run_dir)
        done["mlflow"] = {"from": source, "to": args.mlflow_uri, "run_id": None if args.dry_run
                          else copy_mlflow(run_dir, source, args.mlflow_uri)}
    if not done["wandb"] and "mlflow" not in done:
        raise ConfigError(f"{run_dir}: nothing to sync: no W&B offline run there; for MLflow "
                          "give --mlflow-uri (the server to copy the run to)")
    if args.json:
        print(json.dumps(done, indent=2))
    else:
        if done["wandb"]:
            print(("would run: " if args.dry_run else "ran: ") + " ".join(done["wandb"]))
        if "mlflow" in done:
            m = done["mlflow"]
            print(f"MLflow: {m['from']} -> {m['to']}" + (f" (run {m['run_id']})"
                                                       if m["run_id"] else " (dry run)"))
    return 0
