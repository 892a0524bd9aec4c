"""The tools that explain a recipe or prepare its data: `pack` (many small files into a few
large shards, or a corpus into a token pack; --verify), `profile` (where the time goes),
`memory` (what the memory holds and what fits).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from hpctrain.cli.arguments import JSON_HELP, add_recipe, count, make_verb, size_bytes
from hpctrain.errors import ConfigError, ExitCode



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
    packer = make_verb(verbs, "pack", "pack an image dataset into shards for fast reading, or a "
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
    packer.add_argument("--raw-max-side", type=count(1), default=64, help="--store auto: "
                        "images whose longer side is at most this are stored raw")
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
    memory = make_verb(verbs, "memory", "what a training step holds per device, the batch "
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
    memory.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_memory(args) -> int:
    from hpctrain.config import load_config

    config = load_config(args.recipe, args.overrides)  # told before torch loads, as by `run`
    from hpctrain.cluster.environment import detect
    from hpctrain.memory.advice import (advise, checkpointing_counterpart, largest_batch,
                                        round_batch)
    from hpctrain.memory.estimate import estimate, resolve_target
    from hpctrain.memory.estimate_report import document, text_report, write_picture
    from hpctrain.runs.directory import MEMORY_PREDICTION
    from hpctrain.train.your_loaders import with_your_loaders
    from hpctrain.writers import write_whole

    config = with_your_loaders(config)  # the batch your DataLoader makes
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
    from hpctrain.units import fmt_bytes

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
    from hpctrain.bench import python_profile

    recording = python_profile.Recording()
    if recording.failed:
        done = {}
        python = python_profile.under_cprofile(lambda: done.setdefault("run", train()))
        python.note = f"{recording.failed}: this process under cProfile, its workers not seen"
        return done["run"], python
    run = train()
    python = recording.stop() or python_profile.InputProfile("py-spy", 0.0,
                                                              note=recording.failed)
    return run, python


def _add_profile(verbs) -> None:
    """`hpctrain profile`'s arguments."""
    profile = make_verb(verbs, "profile", "where a training step's time goes, and what to "
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
    profile.add_argument("--json", action="store_true", help=JSON_HELP)


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


def add_verbs(verbs) -> None:
    """This family's verbs, each beside its handler."""
    for add in (_add_pack, _add_profile, _add_memory):
        add(verbs)
