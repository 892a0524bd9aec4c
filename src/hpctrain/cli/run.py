"""The run family: `run` (train a recipe), `config show`, `prefetch` (pretrained weights
for nodes without internet), `recipes`.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.cli.arguments import JSON_HELP, add_recipe, make_verb, rate, seconds
from hpctrain.errors import FetchFailed
from hpctrain.network import Patience



RUN_EXAMPLE = """examples:
  hpctrain run                                   # the built-in default (shapes dataset)
  hpctrain run small-images data.path=/scratch/cifar10 train.epochs=30
  hpctrain run imagenet-resnet50 data.path=/scratch/imagenet train.batch_size=256 precision=bf16
  hpctrain run default resume=auto               # continue the latest run of this recipe
  torchrun --nproc-per-node 8 -m hpctrain run imagenet-resnet50 data.path=/scratch/imagenet
  {step} hpctrain run imagenet-resnet50 run_name=rn50 resume=auto
"""


def _add_run(verbs) -> None:
    """`hpctrain run`'s arguments."""
    from hpctrain.cluster.scheduler import current

    run = make_verb(verbs, "run", "train a recipe",
                    RUN_EXAMPLE.format(step=current().STEP_EXAMPLE), cmd_run)
    add_recipe(run, "key=value settings, e.g. train.epochs=5",
               "shipped recipe name or YAML path (default: 'default')")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")


def cmd_run(args) -> int:
    from hpctrain.config import load_config

    config = load_config(args.recipe, args.overrides)
    # imported once the recipe holds: a bad one is told in 0.3 s, not after torch's 3
    from hpctrain.train.loop import train
    from hpctrain.train.telemetry import print_summary

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
    show = make_verb(config_verbs, "show", "print the resolved configuration",
                     "example:\n  hpctrain config show imagenet-resnet50 train.batch_size=512",
                     cmd_config_show)
    add_recipe(show)
    show.add_argument("--json", action="store_true", help=JSON_HELP)


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
    prefetch = make_verb(verbs, "prefetch", "download what a recipe needs (pretrained weights) "
                         "into the shared caches, where there is internet",
                         "example (on a login node, TORCH_HOME and HF_HOME on shared storage):\n"
                         "  hpctrain prefetch finetune-resnet50 data.path=/scratch/flowers",
                         cmd_prefetch)
    add_recipe(prefetch)
    prefetch.add_argument("--min-rate", type=rate, default=Patience.min_rate, metavar="RATE",
                          help="the slowest a download may arrive on average, in bytes a "
                          "second after its --grace (64k, 2M; default 64k): a slower server "
                          "is stopped, nothing kept")
    prefetch.add_argument("--grace", type=seconds, default=Patience.grace, metavar="SECONDS",
                          help="how long a download may take before its rate counts (the "
                          "connection, the server's first answer, a redirect; default 30)")
    prefetch.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_prefetch(args) -> int:
    from hpctrain.config import load_config
    from hpctrain.models import huggingface, pretrained

    config = load_config(args.recipe, args.overrides)
    patience = Patience(args.min_rate, args.grace)
    fetched = []
    library, _, name = config.model.name.partition(":")
    job = None
    if library == "hf" and not Path(name).expanduser().exists():  # a hub name, not a folder
        job = ("config, weights and tokenizer", lambda: huggingface.prefetch(name, patience))
    elif config.model.pretrained and library != "hf":
        job = ("pretrained weights", lambda: pretrained.prefetch(library, name, patience))
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
    recipes = make_verb(verbs, "recipes", "list the shipped recipes",
                        "example:\n  hpctrain recipes --json", cmd_recipes)
    recipes.add_argument("--json", action="store_true", help=JSON_HELP)


def cmd_recipes(args) -> int:
    from hpctrain.config import shipped_recipes
    from hpctrain.readers import load_yaml, read_text_capped

    rows = []
    for name, path in sorted(shipped_recipes().items()):
        text = read_text_capped(path, 4 << 20)  # hpctrain's own recipes, a few KB each
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


def add_verbs(verbs) -> None:
    """This family's verbs, each beside its handler."""
    for add in (_add_run, _add_config_show, _add_prefetch, _add_recipes):
        add(verbs)
