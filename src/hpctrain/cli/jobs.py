"""The job verbs: `submit` (a recipe as a batch job of the cluster's scheduler), `jobs`,
`logs`, `cancel`, and `status` (of a job or a run directory).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hpctrain.cli.arguments import (JSON_HELP, add_job_options, add_recipe, count, job_options,
                                    make_verb)
from hpctrain.errors import ConfigError



SUBMIT_EXAMPLE = """examples:
  hpctrain submit imagenet-resnet50 data.path=/scratch/imagenet --gpus 16 --time 20:00:00 \\
      --cluster jean-zay-a100 --account abc          # 2 nodes x 8 GPUs, requeued until done
  hpctrain submit default --gpus 4 --time 30 --dry-run     # write the script, submit nothing
  hpctrain submit default --gpus 1 --sweep optim.lr=0.05,0.1,0.2 --sweep train.epochs=4,8

The script goes to RUN_DIR/job.sbatch; logs beside it (Slurm's: slurm-JOBID.out/.err).
Profiles: the shipped ones (generic, jean-zay-v100/-a100/-h100) and yours in
~/.config/hpctrain/clusters.yaml.
"""


def _add_submit(verbs) -> None:
    """`hpctrain submit`'s arguments."""
    submit = make_verb(verbs, "submit", "train a recipe as a Slurm job", SUBMIT_EXAMPLE, cmd_submit)
    add_recipe(submit, "key=value settings for the run")
    submit.add_argument("--gpus", type=count(1), required=True, help="GPUs in all (one task each)")
    add_job_options(submit)
    submit.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                        help="one array job over the values (repeat: cartesian product); "
                        "each element gets its own run directory")
    submit.add_argument("--autotune", nargs="?", const="", metavar="TIME",
                        help="first measure the fastest settings on the job's GPUs (hpctrain "
                        "autotune, its budget TIME: 90s, 10m; default its own), then train "
                        "them; a continuation does not tune again")
    submit.add_argument("--dry-run", action="store_true", help="write and print the script, "
                        "submit nothing")
    submit.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_submit(args) -> int:
    from hpctrain.cluster import jobs
    from hpctrain.cluster.profiles import get_profile

    options = {**job_options(args), "sweep": args.sweep, "autotune": _autotune(args.autotune)}
    if args.dry_run:
        request, script = jobs.plan(args.recipe, args.overrides, args.gpus, args.time,
                                    args.cluster, **options)
        print(script, end="")
        try:
            jobs.check_fits(request, get_profile(args.cluster))
        except jobs.ClusterError as error:  # a preview: say it, still show the script
            print(f"hpctrain: warning: {error}", file=sys.stderr)
        path = jobs.write_script(request, script)
        print(f"hpctrain: dry run: nothing submitted; the script is written to {path} "
              "(its first lines say how to submit it as it is)", file=sys.stderr)
        return 0
    request, script = jobs.plan(args.recipe, args.overrides, args.gpus, args.time,
                                args.cluster, **options)
    job = jobs.send(request, script, get_profile(args.cluster))
    if args.json:
        print(json.dumps({"job_id": job.id, "run_dir": str(job.run_dir),
                          "python": request.python()[1]}))
    else:
        print(f"submitted job {job.id}: {job.run_dir}\n  python: {request.python()[1]}\n"
              f"  follow it: hpctrain jobs; hpctrain logs {job.id} --follow")
    return 0


def _autotune(budget: str | None) -> list[str] | None:
    """autotune's arguments in the job (None: no autotune); its budget checked now."""
    if budget is None:
        return None
    if not budget:
        return []
    from hpctrain.cli.arguments import duration

    try:
        return ["--budget", f"{duration(budget):g}"]
    except argparse.ArgumentTypeError as err:
        raise ConfigError(f"--autotune: {err}") from None


def _add_jobs(verbs) -> None:
    """`hpctrain jobs`'s arguments."""
    queue = make_verb(verbs, "jobs", "your Slurm jobs", "example:\n  hpctrain jobs --json",
                      cmd_jobs)
    queue.add_argument("--name", help="only jobs of this name")
    queue.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_jobs(args) -> int:
    from hpctrain.cluster import jobs

    rows = jobs.queue(name=args.name)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    keys = ("id", "name", "state", "elapsed", "time_left", "nodes", "reason")
    print(columns(("job", "name", "state", "elapsed", "time left", "nodes", "nodes / reason"),
                  [[row[key] for key in keys] for row in rows]) if rows
          else "no jobs in the queue")
    return 0


def columns(header: tuple[str, ...], rows: list[list[str]]) -> str:
    """A plain table, each column as wide as its widest cell: a queue of 1,000 jobs prints in
    milliseconds (rich's table took seconds)."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths))
                     .rstrip() for line in (header, *rows))


def _add_logs(verbs) -> None:
    """`hpctrain logs`'s arguments."""
    logs = make_verb(verbs, "logs", "a job's output",
                     "example:\n  hpctrain logs 123456 --follow", cmd_logs)
    logs.add_argument("job", help="a job id (hpctrain jobs lists them)")
    logs.add_argument("--err", action="store_true", help="the error log instead")
    logs.add_argument("--follow", action="store_true", help="keep printing until it ends")


def cmd_logs(args) -> int:
    from hpctrain.cluster.jobs import Job

    job = Job(args.job)
    if not args.follow:
        for path in job.log_files(err=args.err):
            _print_log(path)
        return 0
    path = job.log_file(err=args.err)
    from hpctrain.cluster.records import FINAL_STATES

    position = 0
    while True:  # print what is new, until the job ends
        if path is not None and (path.is_file() or path.is_symlink()):
            position = _print_log(path, position)
        if job.state.split()[0] in FINAL_STATES:
            return 0
        time.sleep(1)


def _print_log(path, start: int = 0) -> int:
    """The log from byte `start` on, a chunk at a time (a log of any size, never kept
    whole); where it now ends. A log that is a link or no regular file is one line."""
    import codecs

    from hpctrain.readers import chunks

    text = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character cut by a chunk
    try:
        for chunk in chunks(path, start):
            sys.stdout.write(text.decode(chunk))
            start += len(chunk)
    except ValueError as err:  # readers.Unreadable
        raise ConfigError(f"{path} {err}: a job's log is a file the scheduler writes") \
            from None
    sys.stdout.flush()
    return start


def _add_cancel(verbs) -> None:
    """`hpctrain cancel`'s arguments."""
    cancel = make_verb(verbs, "cancel", "cancel jobs", "example:\n  hpctrain cancel 123456",
                       cmd_cancel)
    cancel.add_argument("jobs", nargs="+", help="job ids")


def cmd_cancel(args) -> int:
    from hpctrain.cluster.jobs import Job

    for job_id in args.jobs:
        Job(job_id).cancel()
        print(f"cancelled job {job_id}")
    return 0


def _add_status(verbs) -> None:
    """`hpctrain status`'s arguments."""
    status = make_verb(verbs, "status", "where a job or a run directory stands",
                       "examples:\n  hpctrain status 123456 --json\n"
                       "  hpctrain status runs/default-20261122-101500", cmd_status)
    status.add_argument("job", metavar="JOB|RUN_DIR", help="a job id, or a run directory")
    status.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_status(args) -> int:
    from hpctrain.cluster.jobs import Job, is_job_id, run_status

    place = Path(args.job).expanduser()
    if place.is_dir():
        status = run_status(place.absolute())
    elif not is_job_id(args.job):
        raise ConfigError(f"hpctrain status {args.job}: neither a run directory nor a job id "
                          "(a number, such as 123456)")
    else:
        status = Job(args.job).status()
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        for key, value in status.items():
            if value is not None:
                print(f"{key:<10} {value}")
    return 0


def add_verbs(verbs) -> None:
    """This family's verbs, each beside its handler."""
    for add in (_add_submit, _add_jobs, _add_logs, _add_cancel, _add_status):
        add(verbs)
