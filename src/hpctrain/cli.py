"""The command line: one small function per verb; parsing and printing only.

Exit codes: 0 done, 1 the run failed, 2 bad usage, configuration or input, 75 stopped early
with a checkpoint (preemption or time limit: requeue me). A user mistake prints a message
naming what, where and how to fix, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from hpctrain.errors import Preempted, UserError

RUN_EXAMPLE = """examples:
  hpctrain run                                   # the built-in default (shapes dataset)
  hpctrain run small-images data.path=/scratch/cifar10 train.epochs=30
  hpctrain run imagenet-resnet50 data.path=/scratch/imagenet train.batch_size=256 precision=bf16
  hpctrain run default resume=auto               # continue the latest run of this recipe
  torchrun --nproc-per-node 8 -m hpctrain run imagenet-resnet50 data.path=/scratch/imagenet
  srun --ntasks-per-node 8 hpctrain run imagenet-resnet50 run_name=rn50 resume=auto

exit status 75: stopped early with a checkpoint (preemption signal or time limit); run the
same command again with resume=auto to continue.
"""


def cmd_run(args) -> int:
    from hpctrain.config import load_config
    from hpctrain.train.loop import train
    from hpctrain.train.telemetry import print_summary

    config = load_config(args.recipe, args.overrides)
    summary = train(config)
    if summary is None:  # not rank 0: rank 0 reports for the run
        return 0
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary, summary["run_dir"])
    return 0


def cmd_config_show(args) -> int:
    from hpctrain.config import load_config, to_yaml

    config = load_config(args.recipe, args.overrides)
    if args.json:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
    else:
        print(to_yaml(config), end="")
    return 0


def cmd_recipes(args) -> int:
    import yaml

    from hpctrain.config import shipped_recipes

    rows = []
    for name, path in sorted(shipped_recipes().items()):
        text = path.read_text()
        first = text.splitlines()[0] if text else ""
        description = first.lstrip("# ").strip() if first.startswith("#") else ""
        data = (yaml.safe_load(text) or {}).get("data", {})
        rows.append({"name": name, "description": description,
                     "dataset": data.get("dataset", "shapes"), "path": str(path)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            print(f"{r['name']:<{width}}  {r['description']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpctrain", description="Train deep-learning models on GPU clusters, fast.",
        epilog="run 'hpctrain VERB --help' for a verb's options and examples",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    run = verbs.add_parser("run", help="train a recipe", epilog=RUN_EXAMPLE,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("recipe", nargs="?", default=None,
                     help="shipped recipe name or YAML path (default: 'default')")
    run.add_argument("overrides", nargs="*", help="key=value settings, e.g. train.epochs=5")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.set_defaults(func=cmd_run)

    config = verbs.add_parser("config", help="inspect configurations")
    config_verbs = config.add_subparsers(dest="config_verb", metavar="ACTION")
    config_verbs.required = True
    show = config_verbs.add_parser(
        "show", help="print the resolved configuration",
        epilog="example:\n  hpctrain config show imagenet-resnet50 train.batch_size=512",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("recipe", nargs="?", default=None)
    show.add_argument("overrides", nargs="*")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_config_show)

    recipes = verbs.add_parser("recipes", help="list the shipped recipes",
                               epilog="example:\n  hpctrain recipes --json",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    recipes.add_argument("--json", action="store_true")
    recipes.set_defaults(func=cmd_recipes)
    return parser


def _split_recipe(args) -> None:
    """`hpctrain run key=value` has no recipe: the first positional is then an override."""
    if getattr(args, "recipe", None) and "=" in args.recipe:
        args.overrides = [args.recipe, *args.overrides]
        args.recipe = None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _split_recipe(args)
    try:
        return args.func(args)
    except UserError as err:
        print(f"hpctrain: error: {err}", file=sys.stderr)
        return err.exit_code
    except Preempted as stop:
        if not stop.quiet:
            print(f"hpctrain: {stop} Run the same command again (resume=auto) to continue; "
                  f"exit status {stop.exit_code} means 'requeue me'.", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("hpctrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
