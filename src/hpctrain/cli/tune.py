"""The `hpctrain tune`, `hpctrain scale` and `hpctrain autotune` verbs: parsing and printing
only; the search is tune/search.py (here) and tune/submit.py (Slurm), the scaling study
tune/scale.py, the search for the fastest settings autotune/."""

from __future__ import annotations

import json
import shutil
import signal
import sys

from hpctrain.cli.arguments import (JSON_HELP, add_job_options, add_recipe, count, duration,
                                    job_options, make_verb, seconds)
from hpctrain.errors import ConfigError, ExitCode

TUNE_EXAMPLE = """examples:
  hpctrain tune default --space 'optim.lr=loguniform(0.01,1)' --trials 8 --parallel 2
  hpctrain tune small-images data.path=/scratch/cifar10 \\
      --space 'optim.lr=loguniform(1e-3,1)' --space 'optim.weight_decay=loguniform(1e-6,1e-3)' \\
      --space 'optim.name=choice(sgd,lamb)' --trials 64 --pruner hyperband \\
      --submit --parallel 8 --gpus 1 --time 2:00:00 --account abc   # one array job of 8
  hpctrain tune status runs/default-tune-20261124-101500       # trials, best, pictures
  hpctrain tune --dir runs/default-tune-20261124-101500 --trials 16   # continue, more trials
  hpctrain run runs/default-tune-20261124-101500/best.yaml     # train the best

Each trial is a normal run directory inside the search's folder. Ctrl-C (or a preemption
signal) stops the running trials with a checkpoint; `hpctrain tune --dir DIR` continues the
search, each trial where it stopped. The study lives in the folder (study.journal, safe on
NFS and Lustre) unless --storage names a PostgreSQL database.
"""

TUNE_STATUS_EXAMPLE = """example:
  hpctrain tune status runs/default-tune-20261124-101500 --json
Writes best.yaml (the best trial as a recipe), results.json, history.png and parallel.png
into the search's folder.
"""


def add_verbs(verbs) -> None:
    """`tune` (with its sub-commands `status` and `worker`) and `scale` (with `status`)."""
    from hpctrain.tune.study import PRUNERS, SAMPLERS

    tune = make_verb(verbs, "tune", "search hyper-parameters with Optuna, here or as a Slurm "
                     "array job ('tune status DIR': where a search stands)", TUNE_EXAMPLE,
                     cmd_tune)
    add_recipe(tune, "key=value settings for every trial")
    tune.add_argument("--space", action="append", default=[], metavar="KEY=KIND(ARGS)",
                      help="a parameter to search (repeatable): loguniform(LOW,HIGH), "
                      "uniform(LOW,HIGH[,STEP]), int(LOW,HIGH[,STEP]), logint(LOW,HIGH), "
                      "choice(A,B,...)")
    tune.add_argument("--reduce", action="append", default=[], metavar="KEY=VALUE",
                      help="a setting that makes each trial cheaper (repeatable: "
                      "train.epochs=2, data.kwargs.n_train=320): the trials run with it, "
                      "best.yaml leaves it out and names it")
    tune.add_argument("--trials", type=count(1), help="the budget: trials in all (a grid: "
                      "its size)")
    tune.add_argument("--objective", metavar="KEY:max|min", help="a summary.json figure "
                      "(default: best_val_accuracy:max, best_val_loss:min for language)")
    tune.add_argument("--sampler", choices=SAMPLERS, default="tpe", help="how trials are "
                      "proposed: TPE (Optuna's default), random, a grid, CMA-ES")
    tune.add_argument("--pruner", choices=PRUNERS, default="median",
                      help="stop poor trials at an evaluation (default median)")
    tune.add_argument("--seed", type=count(0), default=0, help="the samplers' seed (each "
                      "worker adds its own)")
    tune.add_argument("--parallel", type=count(1), default=1, help="trials at a time: "
                      "workers here, or with --submit the array's elements")
    tune.add_argument("--processes-per-trial", type=count(1), default=1,
                      help="here: torchrun processes (GPUs) per trial")
    tune.add_argument("--storage", metavar="URL", help="a PostgreSQL URL for the study, or "
                      "sqlite (study.db in the search's folder; not with --submit) (default: "
                      "a journal file in the search's folder)")
    tune.add_argument("--dir", metavar="DIR", help="the search's folder (default: "
                      "OUTPUT_DIR/RECIPE-tune-TIME); an existing one is continued")
    tune.add_argument("--submit", action="store_true", help="run the workers as one Slurm "
                      "array job (--parallel elements)")
    tune.add_argument("--gpus", type=count(1), default=1, help="--submit: GPUs per trial")
    add_job_options(tune)
    tune.add_argument("--dry-run", action="store_true", help="--submit: print the script")
    tune.add_argument("--json", action="store_true", help=JSON_HELP)

    status = tune.add_sub_command("status", TUNE_STATUS_EXAMPLE, cmd_tune_status)
    status.add_argument("folder", metavar="DIR", help="the search's folder")
    status.add_argument("--json", action="store_true", help=JSON_HELP)
    worker = tune.add_sub_command("worker", "", cmd_tune_worker)
    worker.add_argument("folder", metavar="DIR", help="the search's folder")
    worker.add_argument("--slot", required=True, help="this worker's slot: its array element, "
                        "or a number here")
    _add_scale(verbs)
    _add_autotune(verbs)


SCALE_EXAMPLE = """examples:
  hpctrain scale default --gpus 1,2                 # here: torchrun, one process per GPU
  hpctrain scale imagenet-resnet50 data.path=/scratch/imagenet --gpus 1,2,4,8,16 --steps 300 \\
      --submit --time 30 --account abc               # one Slurm job per size
  hpctrain scale status runs/imagenet-resnet50-scale-20261124-101500   # the table, when done
  hpctrain scale tiny-lm --gpus 1,2,4 --strong --json   # the global batch kept, split

Weak scaling by default (the batch per device kept). The throughput is the steady one (after
the first logging interval); efficiency = throughput / (N x one device's). The recommended
size is the largest whose efficiency stays at or above --threshold (0.8).
"""


def cmd_tune(args) -> int:
    from hpctrain.tune import results
    from hpctrain.tune.search import Options, prepare, run_locally

    options = Options(space=args.space, trials=args.trials, objective=args.objective,
                      sampler=args.sampler, pruner=args.pruner, seed=args.seed,
                      storage=args.storage, folder=args.dir,
                      processes_per_trial=args.processes_per_trial, reductions=args.reduce)
    if args.submit:
        return _submit(args, options)
    if args.dry_run:
        raise ConfigError("--dry-run shows the job script of --submit; add --submit")
    folder, search = prepare(args.recipe, args.overrides, options)
    say = _say(args.json)
    say(f"search {folder}: {search.trials} trials of {search.recipe or 'default'}, "
        f"{search.objective} ({search.direction}), {search.sampler} sampler, {search.pruner} "
        f"pruner, {args.parallel} at a time")
    code = run_locally(folder, args.parallel, say)
    result = results.collect(folder)
    print(json.dumps(result, indent=1, default=str) if args.json else results.text(result))
    if code == ExitCode.STOPPED:
        say(f"stopped early; continue with: hpctrain tune --dir {folder}")
    return code


def _say(as_json: bool):
    """Progress lines: on stdout, or on stderr when stdout carries the JSON."""
    stream = sys.stderr if as_json else sys.stdout
    return lambda text: print(text, file=stream, flush=True)


def _submit(args, options) -> int:
    from hpctrain.tune import submit
    from hpctrain.tune.search import prepare

    folder, search = prepare(args.recipe, args.overrides, options, array=True)
    if args.dry_run:
        _, script, _ = submit.plan(folder, search, args.parallel, args.gpus, args.time,
                                   args.cluster, **job_options(args))
        print(script, end="")
        return 0
    job = submit.submit(folder, search, args.parallel, args.gpus, args.time, args.cluster,
                        **job_options(args))
    if args.json:
        print(json.dumps({"job_id": job.id, "folder": str(folder)}))
    else:
        print(f"submitted job {job.id}: {args.parallel} workers for {search.trials} trials in "
              f"{folder}\n  follow it: hpctrain tune status {folder}; hpctrain jobs")
    return 0


def cmd_tune_status(args) -> int:
    from hpctrain.tune import results

    result = results.collect(args.folder)
    print(json.dumps(result, indent=1, default=str) if args.json else results.text(result))
    return 0


def cmd_tune_worker(args) -> int:
    """In an array element (or by hand): take and run trials until the budget is spent. A
    USR1 goes on to the running trial, which saves and stops; a SIGTERM reaches it from
    the scheduler itself; either way the worker ends with 75 and its trial continues in the next
    job of its slot."""
    from hpctrain.tune import results
    from hpctrain.tune.search import local_launches
    from hpctrain.tune.worker import Launch, Worker

    from hpctrain.cluster.scheduler import current, in_job

    launcher = list(current().LAUNCHER)  # the scheduler's, inside its job
    launch = Launch(launcher) if in_job() and shutil.which(launcher[0]) else \
        local_launches(1, 1)[0]
    worker = Worker(args.folder, str(args.slot), launch,
                    lambda text: print(f"hpctrain tune: {text}", flush=True))
    signal.signal(signal.SIGUSR1, lambda *_: worker.stop(forward=True))
    signal.signal(signal.SIGTERM, lambda *_: worker.stop(forward=False))
    code = worker.run()
    if code == 0 and results.nothing_running(args.folder):
        print(results.text(results.collect(args.folder)), flush=True)
    return code


def _add_scale(verbs) -> None:
    scale = make_verb(verbs, "scale", "a scaling study: throughput and efficiency at each GPU "
                      "count, and the count to ask for ('scale status DIR')", SCALE_EXAMPLE,
                      cmd_scale)
    add_recipe(scale, "key=value settings for every size")
    scale.add_argument("--gpus", required=True, metavar="N,N,...",
                       help="the sizes, e.g. 1,2,4,8 (processes without GPUs)")
    scale.add_argument("--steps", type=count(10), default=200, help="per size (default 200)")
    scale.add_argument("--strong", action="store_true", help="keep one device's global "
                       "batch, split over the devices (default: weak, the batch per device)")
    scale.add_argument("--threshold", type=float, default=0.8,
                       help="the efficiency a recommended size keeps (default 0.8)")
    scale.add_argument("--dir", metavar="DIR", help="the study's folder (default: "
                       "OUTPUT_DIR/RECIPE-scale-TIME)")
    scale.add_argument("--submit", action="store_true", help="one Slurm job per size")
    add_job_options(scale)
    scale.add_argument("--json", action="store_true", help=JSON_HELP)
    status = scale.add_sub_command("status", "", cmd_scale_status)
    status.add_argument("folder", metavar="DIR", help="the study's folder")
    status.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_scale(args) -> int:
    from hpctrain.cli.arguments import counts
    from hpctrain.tune import scale

    folder, study = scale.prepare(args.recipe, args.overrides, counts(args.gpus, "--gpus"),
                                  args.steps, args.strong, args.threshold, args.dir)
    say = _say(args.json)
    if args.submit:
        submitted = scale.submit(folder, study, args.time, args.cluster, **job_options(args))
        for size, job_id in submitted:
            say(f"size {size}: job {job_id}")
        if args.json:
            print(json.dumps({"folder": str(folder), "jobs": dict(submitted)}))
        else:
            print(f"when the jobs have ended: hpctrain scale status {folder}")
        return 0
    scale.run_locally(folder, study, say)
    return _print_scale(scale.analyse(folder), args.json)


def cmd_scale_status(args) -> int:
    from hpctrain.tune import scale

    return _print_scale(scale.analyse(args.folder), args.json)


def _print_scale(result: dict, as_json: bool) -> int:
    from hpctrain.tune import scale

    print(json.dumps(result, indent=1) if as_json else scale.text(result))
    return 0 if result["rows"] else 1


AUTOTUNE_EXAMPLE = """examples:
  hpctrain autotune default                        # the budget: 10 % of the run (2-15 min)
  hpctrain autotune tiny-lm --budget 5m --fix precision   # keep the recipe's precision
  hpctrain autotune imagenet-resnet50 data.path=/scratch/imagenet --fix precision=bf16
  hpctrain run runs/default-autotune-20261127-101500/tuned.yaml   # train the pick

Each candidate is a short real run of the recipe (its data path included) in a process of its
own: the recipe as given first, then one setting at a time (precision, compile, channels_last,
the micro-batch with the global batch kept, workers, JPEG decoding), each compared by the run's
predicted time with its one-time costs (start-up, compilation). A candidate the memory
prediction says cannot fit is not run; one that fails or hangs is recorded and the search goes
on. The pick is confirmed by a longer run.
"""


def _add_autotune(verbs) -> None:
    autotune = make_verb(verbs, "autotune", "measure the fastest settings for a run on this "
                         "machine and write them as a recipe", AUTOTUNE_EXAMPLE, cmd_autotune)
    add_recipe(autotune, "key=value settings of the run to tune")
    autotune.add_argument("--budget", type=duration, metavar="TIME", help="the search's time "
                          "in all (90s, 10m, 1h; default 10 %% of the run, 2 to 15 minutes)")
    autotune.add_argument("--fix", action="append", default=[], metavar="KEY[=VALUE]",
                          help="a setting autotune keeps (repeatable): precision keeps the "
                          "recipe's, precision=fp32 sets it")
    autotune.add_argument("--dir", metavar="DIR", help="where the trials, tuned.yaml and "
                          "autotune.json go (default OUTPUT_DIR/RECIPE-autotune-TIME)")
    autotune.add_argument("--warmup-steps", type=count(1), default=10,
                          help="steps of each trial before it is timed (default 10)")
    autotune.add_argument("--measure-steps", type=count(1), help="timed steps of each trial "
                          "(default: about 3 s of the recipe's steps)")
    autotune.add_argument("--trial-seconds", type=seconds, help="the most one trial may "
                          "take (default 3x the recipe's own trial, at least 60 s)")
    autotune.add_argument("--processes", type=count(1), default=1, help="processes (one per "
                          "GPU) each trial trains on: torchrun here, the job's own launcher "
                          "inside a Slurm job (default 1)")
    autotune.add_argument("--no-confirm", action="store_true", help="no longer run of the "
                          "pick to confirm its figure")
    autotune.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_autotune(args) -> int:
    from pathlib import Path

    from hpctrain.config import load_config

    config = load_config(args.recipe, args.overrides)  # told before torch loads
    from hpctrain.autotune import results
    from hpctrain.autotune.search import Options, Search
    from hpctrain.autotune.trials import held_folder
    from hpctrain.runs.directory import stamp

    folder = Path(args.dir or Path(config.output_dir) / f"{config.name}-autotune-{stamp()}")
    options = Options(budget_seconds=args.budget, fixed=args.fix, warmup=args.warmup_steps,
                      measure=args.measure_steps, trial_seconds=args.trial_seconds,
                      confirm=not args.no_confirm, processes=args.processes)
    say = _say(args.json)
    with held_folder(folder.absolute()):  # one autotune at a time in its folder
        search = Search(args.recipe, args.overrides, options, folder.absolute(),
                        lambda text: say(f"autotune: {text}"))
        outcome = search.run()
        document = results.write(outcome)
    print(json.dumps(document, indent=1) if args.json else results.text(outcome, document))
    return ExitCode.INTERRUPTED if outcome.interrupted else ExitCode.DONE
