"""The verbs that read one run back: `report` (its offline HTML page), `watch` (its figures
as they come, and its job's state) and `goodput` (where its device-seconds went). Parsing
and printing only; what they read is report/, runs/watch.py and runs/goodput.py. A run is
named by its folder, its name or id in the runs index, or a job that hpctrain submitted."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain.cli.arguments import JSON_HELP, make_verb
from hpctrain.errors import ConfigError

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


def add_verbs(verbs) -> None:
    """report, watch and goodput, each beside its handler."""
    for add in (_add_report, _add_watch, _add_goodput):
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
    goodput.add_argument("--json", action="store_true", help=JSON_HELP)


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
    if made.startups:
        _print_startups(made.startups)
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


def _print_startups(startups: list[dict]) -> None:
    """Each job's way to its first step, by part: what a requeue costs, and what a kept
    compile cache saves it."""
    from hpctrain.runs.goodput import STARTUP_PARTS

    table = Table(title="each job's way to its first step (seconds)")
    columns = {"job_id": "job", **STARTUP_PARTS, "rest": "records",
               "compilation": "compilation", "first_step": "first step ended at"}
    for name, title in columns.items():
        table.add_column(title, justify="left" if name == "job_id" else "right")
    for number, startup in enumerate(startups, 1):
        table.add_row(*(str(startup["job_id"] or f"#{number}") if name == "job_id" else
                        "-" if startup[name] is None else f"{startup[name]:,.1f}"
                        for name in columns))
    Console(width=100).print(table)


def _goodput_folder(reference: str, db: str | None) -> Path:
    """The run of `reference`: a folder, a name or id in the runs index, or a job id that
    hpctrain submitted (any job of its chain)."""
    from hpctrain.cluster.jobs import Job, is_job_id

    if is_job_id(reference) and not Path(reference).is_dir():

        run_dir = Job(reference).run_dir
        if run_dir is None:
            raise ConfigError(f"job {reference}: not one that hpctrain submitted from this "
                              "account (no run directory remembered): give its run folder")
        return run_dir
    return run_folder(reference, db)


def run_folder(reference: str, db: str | None) -> Path:
    """A run directory given as a folder, or by its name or id in the runs index (read as it
    is: no scan)."""
    folder = Path(reference).expanduser()
    if folder.is_dir():
        return folder.absolute()
    from hpctrain.runs.database import open_database
    from hpctrain.runs.index import Index

    return Path(Index(open_database(db or os.environ.get("HPCTRAIN_DB"))).find(reference)["path"])


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

    folders = [run_folder(reference, args.db) for reference in args.runs]
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
    """(run directory, the job or None) that RUN|JOB names."""
    from hpctrain.cluster.jobs import Job, is_job_id

    if is_job_id(args.run) and not Path(args.run).is_dir():
        job = Job(args.run)
        if job.run_dir is None:
            raise ConfigError(f"job {args.run}: not in the job ledger (not submitted with "
                              "hpctrain submit from this account); give its run directory")
        return job.run_dir, job
    return run_folder(args.run, args.db), None


def _watch_view(shot, scheduler: str) -> str:
    """The reading as text; `scheduler`: the name the job's state is said in ("Slurm")."""
    done = f"step {shot.step}" + (f"/{shot.total_steps}" if shot.total_steps else "")
    eta = f", ETA {shot.eta_seconds / 60:,.1f} min" if shot.eta_seconds is not None else ""
    lines = [f"{shot.run_dir}",
             f"  {shot.status}"
             + (f" ({scheduler}: {shot.slurm_state})" if shot.slurm_state else "")
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
    watch.add_argument("--every", type=float, default=5.0, metavar="SECONDS",
                       help="seconds between refreshes")
    watch.add_argument("--once", action="store_true", help="print one reading and exit")
    watch.add_argument("--db", help="the runs index that names RUN (as for hpctrain runs)")
    watch.add_argument("--json", action="store_true", help=JSON_HELP)


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

    from hpctrain.cluster.jobs import scheduler_of

    title = scheduler_of().TITLE if job is not None else ""  # a run's folder asks none
    shot = look()
    if args.once or args.json or shot.ended:
        print(json.dumps(asdict(shot), indent=2) if args.json else _watch_view(shot, title))
        return 0
    from rich.live import Live

    with Live(_watch_view(shot, title), refresh_per_second=1) as live:
        try:
            while not shot.ended:
                time.sleep(args.every)
                shot = look()
                live.update(_watch_view(shot, title))
        except KeyboardInterrupt:
            pass
    return 0
