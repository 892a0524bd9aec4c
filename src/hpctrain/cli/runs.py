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

from hpctrain.cli.arguments import JSON_HELP, make_verb
from hpctrain.cli.views import run_folder
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


TOP_EXAMPLE = """examples:
  hpctrain top                 # refreshes every 2 s until Ctrl-C; from a login node
  hpctrain top --once --json   # one reading, for scripts

Reads the run directories over the shared file system: the newest "gpu" record of each
running run's metrics.jsonl (written at every logging interval), no daemon on the nodes.
"""


def add_verbs(verbs) -> None:
    """The runs index's verbs and top, each beside its handler."""
    for add in (_add_runs, _add_top):
        add(verbs)


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
    parser.add_argument("--json", action="store_true", help=JSON_HELP)


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
    runs.add_argument("--recipe", help="only the runs of this recipe")
    runs.add_argument("--status", help="completed, failed, preempted, running, lost, ...")
    runs.add_argument("--user", help="only this user's runs")
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
    compare.add_argument("runs", nargs="+", metavar="RUN", help="run ids, folder names or "
                         "paths")
    _common(compare)
    usage = make_verb(actions, "usage", "GPU-hours, kWh, runs and failed share per group",
                      "example:\n  hpctrain runs usage --by month", cmd_runs_usage)
    usage.add_argument("--by", choices=["user", "recipe", "cluster", "month"], default="user",
                       help="the groups")
    _common(usage)
    board = make_verb(actions, "leaderboard", "the race to a target: time, GPU-hours and "
                      "energy to reach it", "example:\n  hpctrain runs leaderboard "
                      "small-images --target best_val_accuracy=0.94", cmd_runs_leaderboard)
    board.add_argument("recipe", help="the recipe whose runs race")
    board.add_argument("--target", required=True, metavar="METRIC=VALUE",
                       help="the figure to reach, e.g. best_val_accuracy=0.94")
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
    top.add_argument("--every", type=float, default=2.0, metavar="SECONDS",
                     help="seconds between refreshes")
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


def cmd_runs_sync(args) -> int:
    from hpctrain.report.sync import copy_mlflow, sync_wandb
    from hpctrain.report.trackers import mlflow_uri
    from hpctrain.runs.directory import RunDir

    if not Path(args.run).expanduser().is_dir():
        _index(args)  # a name or an id: refreshed first, as the other runs verbs do
    run_dir = run_folder(args.run, args.db)
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
