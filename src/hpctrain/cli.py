"""The command line: one small function per verb; parsing and printing only.

Exit codes: errors.ExitCode, shown below every verb's --help. A user mistake prints a message
naming what, where and how to fix, never a traceback; a bug prints its traceback and exits
INTERNAL.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from hpctrain.arguments import (Parser, add_job_options, add_recipe, count, counts, job_options,
                                join_dashed_values, seconds, size_bytes)
from hpctrain import cli_bench, cli_runs, cli_tune
from hpctrain.errors import (ConfigError, ExitCode, FetchFailed, Preempted, UserError,
                             exit_code_table)

RUN_EXAMPLE = """examples:
  hpctrain run                                   # the built-in default (shapes dataset)
  hpctrain run small-images data.path=/scratch/cifar10 train.epochs=30
  hpctrain run imagenet-resnet50 data.path=/scratch/imagenet train.batch_size=256 precision=bf16
  hpctrain run default resume=auto               # continue the latest run of this recipe
  torchrun --nproc-per-node 8 -m hpctrain run imagenet-resnet50 data.path=/scratch/imagenet
  srun --ntasks-per-node 8 hpctrain run imagenet-resnet50 run_name=rn50 resume=auto
"""


def _add_run(verbs) -> None:
    """`hpctrain run`'s arguments."""

    run = _verb(verbs, "run", "train a recipe", RUN_EXAMPLE, cmd_run)
    add_recipe(run, "key=value settings, e.g. train.epochs=5",
               "shipped recipe name or YAML path (default: 'default')")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")


def cmd_run(args) -> int:
    from hpctrain.config import load_config
    from hpctrain.train.loop import train
    from hpctrain.train.telemetry import print_summary

    config = load_config(args.recipe, args.overrides)
    summary = train(config, started=args.started)
    if summary is None:  # not rank 0: rank 0 reports for the run
        return 0
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary, summary["run_dir"])
    return 0


def _add_config_show(verbs) -> None:
    """`hpctrain config show`'s arguments."""
    config = verbs.add_parser("config", help="inspect configurations")
    config_verbs = config.add_subparsers(dest="config_verb", metavar="ACTION")
    config_verbs.required = True
    show = _verb(config_verbs, "show", "print the resolved configuration",
                 "example:\n  hpctrain config show imagenet-resnet50 train.batch_size=512",
                 cmd_config_show)
    add_recipe(show)
    show.add_argument("--json", action="store_true")


def cmd_config_show(args) -> int:
    from hpctrain.config import load_config, to_yaml

    config = load_config(args.recipe, args.overrides)
    if args.json:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    else:
        print(to_yaml(config), end="")
    return 0


def _add_prefetch(verbs) -> None:
    """`hpctrain prefetch`'s arguments."""
    prefetch = _verb(verbs, "prefetch", "download what a recipe needs (pretrained weights) "
                     "into the shared caches, where there is internet",
                     "example (on a login node, TORCH_HOME and HF_HOME on shared storage):\n"
                     "  hpctrain prefetch finetune-resnet50 data.path=/scratch/flowers",
                     cmd_prefetch)
    add_recipe(prefetch)
    prefetch.add_argument("--json", action="store_true")


def cmd_prefetch(args) -> int:
    from hpctrain.config import load_config
    from hpctrain.models import huggingface, pretrained

    config = load_config(args.recipe, args.overrides)
    fetched = []
    library, _, name = config.model.name.partition(":")
    job = None
    if library == "hf" and not Path(name).expanduser().exists():  # a hub name, not a folder
        job = ("config, weights and tokenizer", lambda: huggingface.prefetch(name))
    elif config.model.pretrained and library != "hf":
        job = ("pretrained weights", lambda: pretrained.prefetch(library, name))
    if job is not None:
        try:
            fetched.append({"what": f"{config.model.name} {job[0]}", "path": str(job[1]())})
        except FetchFailed as err:  # a refusal, a hash or size broken, a body cut short
            raise FetchFailed(f"cannot fetch {config.model.name}'s {job[0]}: {err}") from None
        except (OSError, RuntimeError) as err:  # no network
            raise FetchFailed(f"cannot fetch {config.model.name}'s {job[0]}: "
                              f"{type(err).__name__}: {err}; run hpctrain prefetch where "
                              "there is internet") from None
    if args.json:
        print(json.dumps(fetched, indent=2))
    elif not fetched:
        print(f"hpctrain: nothing to fetch: recipe {config.name} reads nothing from the "
              "internet (no model.pretrained, no hf: hub name)")
    for item in [] if args.json else fetched:
        print(f"{item['what']}: {item['path']}")
    return 0


def _add_recipes(verbs) -> None:
    """`hpctrain recipes`'s arguments."""
    recipes = _verb(verbs, "recipes", "list the shipped recipes",
                    "example:\n  hpctrain recipes --json", cmd_recipes)
    recipes.add_argument("--json", action="store_true")


def cmd_recipes(args) -> int:
    from hpctrain.config import shipped_recipes
    from hpctrain.readers import load_yaml

    rows = []
    for name, path in sorted(shipped_recipes().items()):
        text = path.read_text()
        first = text.splitlines()[0] if text else ""
        description = first.lstrip("# ").strip() if first.startswith("#") else ""
        data = (load_yaml(text) or {}).get("data", {})
        rows.append({"name": name, "description": description,
                     "dataset": data.get("dataset", "shapes"), "path": str(path)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            print(f"{r['name']:<{width}}  {r['description']}")
    return 0


SUBMIT_EXAMPLE = """examples:
  hpctrain submit imagenet-resnet50 data.path=/scratch/imagenet --gpus 16 --time 20:00:00 \\
      --cluster jean-zay-a100 --account abc          # 2 nodes x 8 GPUs, requeued until done
  hpctrain submit default --gpus 4 --time 30 --dry-run     # print the script, submit nothing
  hpctrain submit default --gpus 1 --sweep optim.lr=0.05,0.1,0.2 --sweep train.epochs=4,8

The script goes to RUN_DIR/job.sbatch; logs to RUN_DIR/slurm-JOBID.out/.err. Profiles: the
shipped ones (generic, jean-zay-v100/-a100/-h100) and yours in ~/.config/hpctrain/clusters.yaml.
"""


def _add_submit(verbs) -> None:
    """`hpctrain submit`'s arguments."""
    submit = _verb(verbs, "submit", "train a recipe as a Slurm job", SUBMIT_EXAMPLE, cmd_submit)
    add_recipe(submit, "key=value settings for the run")
    submit.add_argument("--gpus", type=count(1), required=True, help="GPUs in all (one task each)")
    add_job_options(submit)
    submit.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                        help="one array job over the values (repeat: cartesian product); "
                        "each element gets its own run directory")
    submit.add_argument("--dry-run", action="store_true", help="print the script only")
    submit.add_argument("--json", action="store_true")


def cmd_submit(args) -> int:
    from hpctrain.cluster import jobs
    from hpctrain.cluster.profiles import get_profile

    options = {**job_options(args), "sweep": args.sweep}
    if args.dry_run:
        request, script = jobs.plan(args.recipe, args.overrides, args.gpus, args.time,
                                    args.cluster, **options)
        print(script, end="")
        try:
            jobs.check_fits(request, get_profile(args.cluster))
        except jobs.ClusterError as error:  # a preview: say it, still show the script
            print(f"hpctrain: warning: {error}", file=sys.stderr)
        return 0
    job = jobs.submit(args.recipe, args.overrides, args.gpus, args.time, args.cluster,
                      **options)
    if args.json:
        print(json.dumps({"job_id": job.id, "run_dir": str(job.run_dir)}))
    else:
        print(f"submitted job {job.id}: {job.run_dir}\n  follow it: hpctrain jobs; "
              f"hpctrain logs {job.id} --follow")
    return 0


def _add_jobs(verbs) -> None:
    """`hpctrain jobs`'s arguments."""
    queue = _verb(verbs, "jobs", "your Slurm jobs", "example:\n  hpctrain jobs --json",
                  cmd_jobs)
    queue.add_argument("--name", help="only jobs of this name")
    queue.add_argument("--json", action="store_true")


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
    logs = _verb(verbs, "logs", "a job's output",
                 "example:\n  hpctrain logs 123456 --follow", cmd_logs)
    logs.add_argument("job")
    logs.add_argument("--err", action="store_true", help="the error log instead")
    logs.add_argument("--follow", action="store_true", help="keep printing until it ends")


def cmd_logs(args) -> int:
    from hpctrain.cluster.jobs import Job

    job = Job(args.job)
    if not args.follow:
        print(job.logs(err=args.err), end="")
        return 0
    path = job.log_file(err=args.err)
    from hpctrain.cluster.jobs import FINAL_STATES

    position = 0
    while True:  # print what is new, until the job ends
        if path is not None and path.is_file():
            with open(path, errors="replace") as log:
                log.seek(position)
                sys.stdout.write(log.read())
                sys.stdout.flush()
                position = log.tell()
        if job.state.split()[0] in FINAL_STATES:
            return 0
        time.sleep(1)


def _add_cancel(verbs) -> None:
    """`hpctrain cancel`'s arguments."""
    cancel = _verb(verbs, "cancel", "cancel jobs", "example:\n  hpctrain cancel 123456",
                   cmd_cancel)
    cancel.add_argument("jobs", nargs="+")


def cmd_cancel(args) -> int:
    from hpctrain.cluster.jobs import Job

    for job_id in args.jobs:
        Job(job_id).cancel()
        print(f"cancelled job {job_id}")
    return 0


def _add_status(verbs) -> None:
    """`hpctrain status`'s arguments."""
    status = _verb(verbs, "status", "where a job or a run directory stands",
                   "examples:\n  hpctrain status 123456 --json\n"
                   "  hpctrain status runs/default-20261122-101500", cmd_status)
    status.add_argument("job", metavar="JOB|RUN_DIR")
    status.add_argument("--json", action="store_true")


def cmd_status(args) -> int:
    from hpctrain.cluster.jobs import Job, run_status

    place = Path(args.job).expanduser()
    if place.is_dir():
        status = run_status(place.absolute())
    elif not args.job.replace("_", "").isdigit():  # 123456, or an array's 123456_7
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


PACK_EXAMPLE = """examples:
  hpctrain pack /scratch/imagenet /scratch/imagenet-packed --max-side 512
  hpctrain pack labels.csv /scratch/packed --store auto --raw-max-side 64
  hpctrain run imagenet-resnet50 data.dataset=shards data.path=/scratch/imagenet-packed
  hpctrain pack --tokens /scratch/corpus /scratch/corpus-tokens --tokenizer ./gpt2-tokenizer
  hpctrain pack --verify /scratch/imagenet-packed
  hpctrain run tiny-lm data.dataset=tokens data.path=/scratch/corpus-tokens
An interrupted pack resumes when run again with the same arguments.
"""


def _verify_pack(args) -> int:
    """Exit 2 naming every damaged file and sample; 0 when the pack is intact."""
    from hpctrain.data.verify import verify

    if args.src or args.dst:
        raise ConfigError("hpctrain pack --verify PACK checks a pack: give no SRC DST with it")
    result = verify(args.verify)
    print(json.dumps(result.as_dict(), indent=1) if args.json else result.describe())
    return 0 if result.ok else 2


def _token_pack_options(args):
    from hpctrain.data.tokens.token_packing import TokenPackOptions

    image_only = [flag for flag, given in (
        ("--max-side", args.max_side is not None), ("--store", args.store != "jpeg"),
        ("--quality", args.quality is not None), ("--raw-fraction", args.raw_fraction != 0),
        ("--keep-order", args.keep_order)) if given]
    if image_only:
        raise ConfigError(f"{', '.join(image_only)} apply to image packs, not to --tokens")
    if not 0 <= args.val_fraction < 1:
        raise ConfigError(f"--val-fraction {args.val_fraction}: use a share from 0 to below 1")
    return TokenPackOptions(tokenizer=args.tokenizer, val_fraction=args.val_fraction,
                            shard_bytes=size_bytes(args.shard_size, "--shard-size"))


def _image_pack_options(args):
    from hpctrain.data.images.image_packing import PackOptions

    if args.tokenizer:
        raise ConfigError("--tokenizer applies to token packs: add --tokens")
    if args.quality is not None and not 1 <= args.quality <= 100:
        raise ConfigError(f"--quality {args.quality}: use 1 to 100")
    if not 0 <= args.raw_fraction <= 1:
        raise ConfigError(f"--raw-fraction {args.raw_fraction}: use a share from 0 to 1")
    if args.raw_fraction and args.store != "auto":
        raise ConfigError("--raw-fraction applies to --store auto; add --store auto")
    return PackOptions(max_side=args.max_side, store=args.store,
                       raw_max_side=args.raw_max_side, raw_fraction=args.raw_fraction,
                       quality=args.quality, shuffle=not args.keep_order,
                       shard_bytes=size_bytes(args.shard_size, "--shard-size"))


def _add_pack(verbs) -> None:
    """`hpctrain pack`'s arguments."""
    packer = _verb(verbs, "pack", "pack an image dataset into shards for fast reading, or a "
                   "text corpus into token shards (--tokens)", PACK_EXAMPLE, cmd_pack)
    packer.add_argument("src", nargs="?", help="an ImageFolder tree (with train/ and val/, or "
                        "one tree), or a CSV/list file of path,label lines; with --tokens a "
                        "folder of .txt files (one document each) and .jsonl files (a 'text' "
                        "field per line), optionally in train/ and val/")
    packer.add_argument("dst", nargs="?", help="the pack folder (must be empty, or unfinished "
                        "to resume)")
    packer.add_argument("--verify", metavar="PACK", help="check every shard's SHA-256 and "
                        "every sample's CRC-32 of PACK instead (exit 2 naming each damaged "
                        "shard or sample)")
    packer.add_argument("--max-side", type=count(1), help="pre-resize: longer side at most this")
    packer.add_argument("--store", choices=("jpeg", "raw", "auto"), default="jpeg",
                        help="JPEG bytes, raw pixels (no decoding), or raw for images whose "
                        "longer side is at most --raw-max-side (default: jpeg)")
    packer.add_argument("--raw-max-side", type=count(1), default=64)
    packer.add_argument("--raw-fraction", type=float, default=0.0, metavar="F",
                        help="with --store auto, also store this share of the larger images "
                        "raw: no decoding, ~6x the bytes (FFCV's proportion mode; default 0)")
    packer.add_argument("--quality", type=int, help="re-encode every JPEG at this quality "
                        "(default: keep original JPEG bytes; re-encoded images use 90)")
    packer.add_argument("--shard-size", default="256MB", help="about this much per shard")
    packer.add_argument("--workers", type=count(1), help="processes (default: all cores)")
    packer.add_argument("--keep-order", action="store_true",
                        help="keep the source order (sample i of the pack is line or file i); "
                        "default: shuffled, so that sequential tar readers see mixed classes")
    packer.add_argument("--strict", action="store_true",
                        help="abort on an unreadable image (or a text file that is not "
                        "UTF-8) instead of skipping it")
    packer.add_argument("--overwrite", action="store_true",
                        help="replace what DST holds")
    packer.add_argument("--json", action="store_true", help="print the manifest as JSON")
    packer.add_argument("--tokens", action="store_true",
                        help="tokenize text into a token pack (data.dataset=tokens)")
    packer.add_argument("--tokenizer", metavar="PATH", help="--tokens: a Hugging Face "
                        "tokenizer.json or its folder (needs hpctrain[text]); default: "
                        "byte-level, nothing to download")
    packer.add_argument("--val-fraction", type=float, default=0.01, metavar="F",
                        help="--tokens without train/ and val/ folders: the share of "
                        "documents held out for validation (default 0.01)")


def cmd_pack(args) -> int:
    if args.verify:
        return _verify_pack(args)
    if not args.src or not args.dst:
        raise ConfigError("hpctrain pack SRC DST: give the source and the pack folder (or "
                          "--verify PACK to check a pack)")
    if args.tokens:
        from hpctrain.data.tokens.token_packing import describe, pack_tokens as write
        options = _token_pack_options(args)
    else:
        from hpctrain.data.images.image_packing import describe, pack as write
        options = _image_pack_options(args)
    log = (lambda text: print(text, file=sys.stderr)) if args.json else print
    manifest = write(Path(args.src), Path(args.dst), options, workers=args.workers,
                     strict=args.strict, overwrite=args.overwrite, log=log)
    print(json.dumps(manifest, indent=1) if args.json else describe(manifest))
    return 0


BENCH_DATA_EXAMPLE = """examples:
  hpctrain bench data imagenet-resnet50 data.path=/scratch/imagenet-packed
  hpctrain bench data imagenet-resnet50 data.path=/scratch/imagenet-packed --model \\
      --processes-per-node 8             # per GPU of an 8-GPU node: its share of the cores
  hpctrain bench data default --workers 1,2 --prefetch 2 --seconds 3 --json
  hpctrain bench data imagenet-resnet50 data.path=/scratch/imagenet-packed --python
"""


def _add_bench(verbs) -> None:
    """`hpctrain bench` and its parts' arguments."""
    bench = verbs.add_parser("bench", help="measure one part of the training pipeline")
    bench_verbs = bench.add_subparsers(dest="bench_verb", metavar="PART")
    bench_verbs.required = True
    bench_data = _verb(bench_verbs, "data", "how fast the input pipeline runs, and whether "
                       "it keeps the model fed", BENCH_DATA_EXAMPLE, cmd_bench_data)
    add_recipe(bench_data)
    bench_data.add_argument("--workers", help="DataLoader worker counts to try, e.g. 2,4,8 "
                            "(default: 1, 2, 4, ... up to the cores)")
    bench_data.add_argument("--prefetch", default="2,4", help="prefetch depths to try")
    bench_data.add_argument("--seconds", type=seconds, default=5.0,
                            help="timing per setting (default 5)")
    bench_data.add_argument("--model", action="store_true",
                            help="also time the recipe's training step on synthetic data")
    bench_data.add_argument("--model-steps", type=count(1), default=30)
    bench_data.add_argument("--processes-per-node", type=count(1), default=1,
                            help="training processes (GPUs) sharing this node's cores")
    bench_data.add_argument("--python", action="store_true",
                            help="then sample the training process and its workers at the "
                            "recommended setting (py-spy, else cProfile): the hottest Python "
                            "functions and the shares of reading, decoding, augmentation, "
                            "transport and the rest")
    bench_data.add_argument("--json", action="store_true")
    cli_bench.add_verbs(bench_verbs, _verb)


def cmd_bench_data(args) -> int:
    from hpctrain.bench.data_path import bench_data

    report = bench_data(args.recipe, args.overrides, counts(args.workers, "--workers"),
                        counts(args.prefetch, "--prefetch"), args.seconds, args.model,
                        args.model_steps, args.processes_per_node, args.python)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    what = f"{report.image_size} px" if report.unit == "image" else f"{report.unit}s"
    print(f"input pipeline of {report.recipe}: {report.dataset}, batch {report.batch_size}, "
          f"{what}, {report.cores} cores for this process")
    if report.decode_one_core is not None:
        print(f"decode only, one core ({report.decoder or 'PIL'}): "
              f"{report.decode_one_core:,.0f} img/s")
    rate = "img/s" if report.unit == "image" else f"{report.unit}s/s"
    print(f"{'workers':>8}{'prefetch':>10}{rate:>12}")
    for s in report.settings:
        mark = "  <- best" if s is report.best else ""
        print(f"{s.num_workers:>8}{s.prefetch_factor:>10}{s.samples_per_second:>12,.0f}{mark}")
    if report.ratio is not None:
        print(f"best: {report.ratio:.0%} of the decode limit ({report.ceiling:,.0f} img/s = "
              f"one core x {min(report.best.num_workers, report.cores)})")
    if report.model_samples_per_second is not None:
        print(f"model training step alone: {report.model_samples_per_second:,.0f} {rate}")
    if report.python is not None:
        print("\n".join(report.python.lines()))
    for line in report.advice:
        print(f"- {line}")
    return 0


PROFILE_EXAMPLE = """examples:
  hpctrain profile                               # the built-in default, on this machine
  hpctrain profile imagenet-resnet50 data.path=/scratch/imagenet --steps 10
  torchrun --nproc-per-node 8 -m hpctrain profile imagenet-resnet50 data.path=/scratch/imagenet
  hpctrain profile --trace runs/default-profile-20261122-134528   # analyse, run nothing
  hpctrain profile --trace traces/ --json        # one trace file per rank in a folder

The trace (gzip JSON) opens in https://ui.perfetto.dev; profile.json, profile.html and
profile.png are written beside it.
"""


MEMORY_EXAMPLE = """examples:
  hpctrain memory                                  # the default recipe on the assumed GPU
  hpctrain memory imagenet-resnet50 --gpu-memory a100-40gb
  hpctrain memory imagenet-resnet50 train.batch_size=512 --world-size 8 --json
  hpctrain memory imagenet-resnet50 --measure      # real steps on this machine beside it
  torchrun --nproc-per-node 4 -m hpctrain memory imagenet-resnet50 --find-batch-size

--gpu-memory takes a size (80GB, 40GiB, 81559MiB) or a GPU name (h100, a100-40gb, v100-32gb).
"""


def _add_memory(verbs) -> None:
    """`hpctrain memory`'s arguments."""
    memory = _verb(verbs, "memory", "what a training step holds per device, the batch "
                   "that fits, and which parallelism to use", MEMORY_EXAMPLE, cmd_memory)
    add_recipe(memory)
    memory.add_argument("--gpu-memory", metavar="SIZE",
                        help="device memory: 80GB, 40GiB or a GPU name (default: this "
                             "machine's GPU, else an H100)")
    memory.add_argument("--world-size", type=int, metavar="N",
                        help="devices the run will use (default: this launch's processes)")
    memory.add_argument("--measure", action="store_true",
                        help="run real steps here and compare with the prediction")
    memory.add_argument("--find-batch-size", action="store_true",
                        help="search the largest batch that fits with real steps (under "
                             "torchrun: on every rank, all agreeing)")
    memory.add_argument("--steps", type=count(1), default=3,
                        help="real steps per measurement or try (default 3)")
    memory.add_argument("--out", metavar="DIR",
                        help="where the PNG goes (default: the recipe's output_dir)")
    memory.add_argument("--json", action="store_true")


def cmd_memory(args) -> int:
    from hpctrain.cluster.environment import detect
    from hpctrain.config import load_config
    from hpctrain.memory.advice import (advise, checkpointing_counterpart, largest_batch,
                                        round_batch)
    from hpctrain.memory.estimate import estimate, resolve_target
    from hpctrain.memory.estimate_report import document, text_report, write_picture
    from hpctrain.runs.directory import MEMORY_PREDICTION
    from hpctrain.writers import write_whole

    config = load_config(args.recipe, args.overrides)
    env = detect()
    per_copy = config.parallel.tensor * config.parallel.pipeline  # one model copy at least
    world = max(env.world_size, per_copy) if args.world_size is None else args.world_size
    if world < 1:
        raise ConfigError(f"--world-size {world}: give 1 or more devices")
    target = resolve_target(config, args.gpu_memory, world)
    est = estimate(config, target)
    counterpart = checkpointing_counterpart(est, config)
    advice = advise(est, config, counterpart)
    measured = search = None
    if args.measure and per_copy > 1:
        raise ConfigError("--measure runs one device's step, not a split model's; measure "
                          "with parallel.tensor=1 parallel.pipeline=1 (and, to fit one GPU, "
                          "model.activation_checkpointing=true)")
    if args.measure:
        from hpctrain.memory.measure import measure

        measured = measure(est, config, steps=args.steps)
    if args.find_batch_size:
        from hpctrain.memory.batch_search import find_batch_size

        start = round_batch(advice.largest_batch or largest_batch(est, config)[0]) or 1
        search = find_batch_size(config, target, start, steps=args.steps, env=env)
    if env.rank != 0:
        return 0
    folder = Path(args.out or config.output_dir)
    picture = write_picture(est, advice, folder / f"{config.name}-memory.png")
    fits = search.largest is not None if search else est.fits
    out = document(est, advice, measured, counterpart)
    out["search"] = search.to_json() if search else None
    out["picture"] = str(picture)
    # beside the picture: a run directory given as --out shows it in its report
    write_whole(folder / MEMORY_PREDICTION.format(recipe=config.name),
                json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out, indent=2))
        return ExitCode.DONE if fits else ExitCode.DOES_NOT_FIT
    print(text_report(est, advice, measured, counterpart))
    if search:
        _print_batch_search(search, target.capacity)
    print(f"\npicture: {picture} (and {config.name}-memory.json; with --out RUN_DIR, the "
          "run's report shows the prediction)")
    return ExitCode.DONE if fits else ExitCode.DOES_NOT_FIT


def _print_batch_search(search, capacity: int) -> None:
    """`memory --find-batch-size`'s trials, the largest batch and the settings for it."""
    from hpctrain.memory.sizes import fmt_bytes

    limit = f", {fmt_bytes(capacity)} emulated by counting storages" \
        if search.device == "cpu" else ""
    print(f"\nbatch search on {search.world_size} x {search.device} ({search.strategy}"
          f"{limit}):")
    for t in search.trials:
        rate = f"{t.images_per_second:,.0f} img/s" if t.images_per_second else ""
        peak = fmt_bytes(t.peak_bytes) if t.peak_bytes else ""
        print(f"  batch {t.batch_size:>6}: {'fits' if t.fits else 'out of memory':<14}"
              f"{peak:>11}  {rate}")
    if search.largest is None:
        print("  not even batch 1 fits: see the advice above")
    else:
        print(f"  largest: {search.largest}; recommended: {' '.join(search.settings)} "
              f"(global batch {search.global_batch_size})")


def _with_python_sampling(train):
    """(`train()`'s result, an InputProfile): the run sampled by py-spy with its loader
    workers; where py-spy cannot attach, this process alone under cProfile."""
    from hpctrain.data import python_sampling

    recording = python_sampling.Recording()
    if recording.failed:
        done = {}
        python = python_sampling.under_cprofile(lambda: done.setdefault("run", train()))
        python.note = f"{recording.failed}: this process under cProfile, its workers not seen"
        return done["run"], python
    run = train()
    python = recording.stop() or python_sampling.InputProfile("py-spy", 0.0,
                                                              note=recording.failed)
    return run, python


def _add_profile(verbs) -> None:
    """`hpctrain profile`'s arguments."""
    profile = _verb(verbs, "profile", "where a training step's time goes, and what to "
                    "change", PROFILE_EXAMPLE, cmd_profile)
    add_recipe(profile)
    profile.add_argument("--steps", type=int, default=5,
                         help="active (recorded) steps, after 2 wait and 2 warm-up steps")
    profile.add_argument("--python", action="store_true",
                         help="also sample the training process and its loader workers "
                         "(py-spy, else cProfile): the hottest Python functions and the "
                         "shares of reading, decoding, augmentation, transport and the rest")
    profile.add_argument("--trace", metavar="FILE_OR_DIR",
                         help="analyse this trace (or folder of per-rank traces, or run "
                              "directory) instead of running")
    profile.add_argument("--out", metavar="DIR",
                         help="where profile.json/html/png go (default: beside the trace)")
    profile.add_argument("--json", action="store_true")


def cmd_profile(args) -> int:
    from hpctrain.profiling.profile_report import (analyse_traces, find_traces, settings_from_run,
                                           text_report, write_reports)
    from hpctrain.profiling.verdict import decide
    from hpctrain.runs.directory import RunDir

    python = None
    if args.trace:
        if args.recipe or args.overrides or args.python:
            raise ConfigError("--trace analyses an existing trace: give it without a recipe, "
                              "overrides or --python")
        traces = find_traces(args.trace)
        folder = traces[0].parent
        run_dir = folder.parent if RunDir(folder.parent).config.is_file() else None
        settings = settings_from_run(run_dir)
        title = f"profile of {args.trace}"
    else:
        from hpctrain.config import load_config
        from hpctrain.train.profile_run import Schedule, profile_run

        if args.steps < 1:
            raise ConfigError(f"--steps {args.steps}: profile at least 1 step")
        config = load_config(args.recipe, args.overrides)

        def train():
            # with --json, stdout carries the report alone: the run's own lines go to stderr
            with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
                return profile_run(config, Schedule(active=args.steps))

        run, python = _with_python_sampling(train) if args.python else (train(), None)
        if run.rank != 0:  # rank 0 analyses every rank's trace
            return 0
        traces, folder = find_traces(run.trace_dir), run.trace_dir
        settings = settings_from_run(run.run_dir, args.recipe or "default")
        title = f"profile of {args.recipe or 'default'} ({run.run_dir.name})"
    ranks = analyse_traces(traces)
    verdict = decide(ranks, settings)
    text = text_report(ranks, verdict)
    outputs = write_reports(Path(args.out) if args.out else folder, ranks, verdict, title, text)
    if args.json:
        print(json.dumps({"verdict": verdict.to_json(), "ranks": [e.to_json() for e in ranks],
                          "traces": [str(t) for t in traces],
                          "outputs": {k: str(v) for k, v in outputs.items()},
                          "python": python.to_json() if python else None}, indent=2))
        return 0
    print(title)
    print(text)
    if python is not None:
        print("\n" + "\n".join(python.lines()))
    print(f"\ntrace: {', '.join(str(t) for t in traces)} (opens in https://ui.perfetto.dev)")
    print(f"report: {', '.join(str(v) for v in outputs.values())}")
    return 0


def _verb(verbs, name: str, help: str | None, epilog: str, func) -> argparse.ArgumentParser:
    """A verb's parser: its help, its examples and the exit codes below the options, the
    function it runs."""
    listed = {"help": help} if help is not None else {}  # None: a verb of another's
    parser = verbs.add_parser(name, epilog=f"{epilog.rstrip()}\n\n{exit_code_table()}",
                              formatter_class=argparse.RawDescriptionHelpFormatter, **listed)
    parser.set_defaults(func=func)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="hpctrain", description="Train deep-learning models on GPU clusters, fast.",
        epilog="run 'hpctrain VERB --help' for a verb's options and examples\n\n"
               + exit_code_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_versions(),
                        help="hpctrain's version, and torch's and Python's beside it")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    for add in (_add_run, _add_config_show, _add_submit, _add_jobs, _add_logs, _add_cancel,
                _add_status, _add_pack, _add_bench, _add_profile, _add_memory, _add_prefetch,
                _add_recipes):
        add(verbs)  # each beside its handler below
    cli_runs.add_verbs(verbs, _verb)
    cli_tune.add_verbs(verbs, _verb)
    return parser


def _versions() -> str:
    """What a bug report needs first, without importing torch (seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    from hpctrain.version import __version__
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "not installed"
    python = ".".join(map(str, sys.version_info[:3]))
    return f"hpctrain {__version__} (torch {torch}, Python {python})"


def _split_recipe(args) -> None:
    """`hpctrain run key=value` has no recipe: the first positional is then an override."""
    if getattr(args, "recipe", None) and "=" in args.recipe:
        args.overrides = [args.recipe, *args.overrides]
        args.recipe = None


def _parse(argv: list[str] | None):
    """Like parse_args, but key=value overrides may also come after options
    (`hpctrain submit default --gpus 8 train.epochs=3`)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if (argv[:1] == ["tune"] and argv[1:2] in (["status"], ["worker"])) or \
            argv[:2] == ["scale", "status"]:  # their own verbs beside the recipe argument
        argv = [f"{argv[0]}-{argv[1]}", *argv[2:]]
    args, extra = parser.parse_known_args(join_dashed_values(argv))
    late = [a for a in extra if "=" in a and not a.startswith("-")]
    if len(late) != len(extra) or (late and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(a for a in extra if a not in late)}"
                     if len(late) != len(extra) else f"unrecognized arguments: {' '.join(late)}")
    if late:
        args.overrides = [*args.overrides, *late]
    return args


def main(argv: list[str] | None = None, own_process: bool = False) -> int:
    """The verb `argv` names; its exit code. `own_process`: hpctrain's own command
    (console.entry), which ends with the verb: stop signals after a run has ended leave its
    exit status as it is."""
    from hpctrain.train.preemption import catch_early, release_early

    started = time.perf_counter()  # a run's time counts from here (importing torch takes s)
    args = _parse(argv)
    args.started = started
    trains = args.verb in ("run", "profile")
    if trains:  # a stop signal must find them listening; the run's Stopper takes them over
        catch_early(until_exit=own_process)
    if args.verb in ("profile", "memory"):  # they run torch's profiler
        from hpctrain.profiling.kineto_log import quiet_without_gpu

        quiet_without_gpu()
    _split_recipe(args)
    try:
        return _dispatch(args, release_early if not trains else None)
    finally:
        if trains:
            release_early()


def _dispatch(args, release_held: Callable[[], None] | None = None) -> int:
    """Run the verb; a user's mistake becomes its message and exit code. `release_held`: give
    back the signals held since the start (a Ctrl-C meanwhile is acted on there)."""
    try:
        if release_held is not None:
            release_held()
        return args.func(args)
    except UserError as err:
        print(f"hpctrain: error: {err}", file=sys.stderr)
        return err.exit_code
    except Preempted as stop:
        stop.tell()
        return stop.exit_code
    except KeyboardInterrupt:
        print("hpctrain: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception:  # a bug: its traceback, and the code that says so
        traceback.print_exc()
        print("hpctrain: internal error: the exception above was not expected. Where its "
              "traceback ends in your own model or dataset code, the bug is there; else "
              "please report it to hpctrain with the traceback", file=sys.stderr)
        return ExitCode.INTERNAL
