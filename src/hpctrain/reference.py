"""The reference pages, generated from the code: every recipe key from the configuration's
schema (its type, default, bounds and description, each data section with the kind it belongs
to) and every verb from the command line's parser (its options and examples). Written by
`python -m hpctrain.reference docs/reference`; tests/unit/test_reference.py fails when the
committed pages differ from what the code generates, so the reference cannot drift from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel

RECIPE_PAGE = "recipe.md"
COMMANDS_PAGE = "commands.md"
HIDDEN_VERBS = ("worker",)  # `tune worker`: what an array element runs, not for people
KINDS = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "text",
         "NoneType": "null"}


def type_words(annotation) -> str:
    """A field's type as a reader says it: 'a whole number or auto', 'one of sgd, adamw'."""
    origin, members = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        said = list(dict.fromkeys(word for m in members for word in (
            ("true", "false") if m is bool else (type_words(m),))))
        return ", ".join(said[:-1]) + " or " + said[-1] if len(said) > 1 else said[0]
    if origin is typing.Literal:
        shown = [json.dumps(m) if not isinstance(m, str) else m for m in members]
        return shown[0] if len(shown) == 1 else "one of " + ", ".join(shown)
    if origin in (tuple, list):
        inner = " or ".join(dict.fromkeys(type_words(m) for m in members if m is not Ellipsis))
        count = f" of {len(members)}" if origin is tuple and Ellipsis not in members else ""
        return f"a list{count}, each {inner}" if inner else "a list"
    if origin is dict or annotation is dict:
        return "a mapping"
    return KINDS.get(getattr(annotation, "__name__", ""), str(annotation))


def _number(value) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def bounds_words(field) -> str:
    """A field's bounds: '>= 1', '0 < x < 1', 'matches ^auto$', from pydantic's metadata."""
    said = []
    for rule in field.metadata:
        for name, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(rule, name, None) is not None:
                said.append(f"{sign} {_number(getattr(rule, name))}")
        if getattr(rule, "min_length", None):
            said.append(f"at least {rule.min_length} long")
        if getattr(rule, "max_length", None):
            said.append(f"at most {rule.max_length} long")
        if getattr(rule, "pattern", None):
            said.append(f"matches `{rule.pattern}`")
    return ", ".join(said)


def default_words(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    return "`" + json.dumps(value, default=str) + "`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(model: type[BaseModel], path: str) -> tuple[list[str], list[tuple[str, type]]]:
    """The table rows of `model`'s own keys, and its sub-sections (their paths, models)."""
    rows, subsections = [], []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            subsections.append((f"{path}{name}", field.annotation))
            continue
        rows.append(f"| `{path}{name}` | {_cell(type_words(field.annotation))} | "
                    f"{_cell(default_words(field))} | {_cell(bounds_words(field))} | "
                    f"{_cell(field.description or '')} |")
    return rows, subsections


def recipe_reference() -> str:
    """docs/reference/recipe.md: every key of a recipe, by section."""
    from hpctrain.config import Config
    from hpctrain.data import kinds
    from hpctrain.tasks import registry

    kind_of_section = {f"data.{name}": kind.name for kind in kinds.KINDS.values()
                       for name in kind.settings}
    lines = ["# Recipe reference", "",
             "Every key of a recipe, generated from the configuration's schema "
             "(`python -m hpctrain.reference docs/reference`; a test fails when this page "
             "differs from the code). Set a key in the recipe's YAML by its section, or on "
             "the command line as `key=value` (`hpctrain run default train.epochs=3`); "
             "`hpctrain config show RECIPE` prints the whole resolved recipe.", "",
             "The tasks (`task.name`), and the data kind each learns from: " + ", ".join(
                 f"`{name}` ({spec.data_kind})" for name, spec in registry.SPECS.items())
             + "; `auto` takes the data kind's first.", ""]
    pending = [("", Config)]
    while pending:
        path, model = pending.pop(0)
        rows, subsections = _section(model, f"{path}." if path else "")
        title = f"`{path}`" if path else "The top level"
        lines += [f"## {title}", ""]
        if path in kind_of_section:
            lines += [f"Read for data of kind `{kind_of_section[path]}` only.", ""]
        doc = (model.__doc__ or "").strip()
        if doc and model.__doc__ != BaseModel.__doc__:
            lines += [" ".join(doc.split()), ""]
        if rows:
            lines += ["| key | type | default | bounds | description |",
                      "|---|---|---|---|---|", *rows, ""]
        pending[0:0] = subsections
    return "\n".join(lines).rstrip() + "\n"


def _options(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:  # argparse keeps its arguments here, and nowhere public
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or \
                action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{o}`" for o in action.option_strings) or \
            f"`{action.metavar or action.dest}`"
        value = "" if action.nargs == 0 else f"`{action.metavar or action.dest.upper()}`"
        default = "" if action.default in (None, False, [], argparse.SUPPRESS) or \
            not action.option_strings else f"`{action.default}`"
        rows.append(f"| {name} | {value} | {default} | {_cell(action.help or '')} |")
    return ["| argument | value | default | what |", "|---|---|---|---|", *rows] if rows \
        else []


def _examples(parser: argparse.ArgumentParser) -> list[str]:
    """The verb's epilog without the exit-code table every verb shares (given once)."""
    text = (parser.epilog or "").split("exit status:")[0].rstrip()
    return ["```", text, "```"] if text else []


def _verb(name: str, parser: argparse.ArgumentParser, summary: str | None) -> list[str]:
    lines = [f"## `{name}`", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ".", ""]
    lines += ["```", parser.format_usage().strip().removeprefix("usage: "), "```", ""]
    if options := _options(parser):
        lines += [*options, ""]
    lines += _examples(parser)
    for sub, child, summary in _children(parser):
        if sub not in HIDDEN_VERBS:
            lines += ["", *_verb(f"{name} {sub}", child, summary)]
    return lines


def _children(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser,
                                                           str | None]]:
    """A verb's own sub-commands (`tune status`) and argparse's (`config show`, `runs
    compare`): (name, parser, summary)."""
    found = [(sub, child, None) for sub, child in getattr(parser, "sub_commands", {}).items()]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            found += [(sub, child, summaries.get(sub)) for sub, child in action.choices.items()]
    return found


def commands_reference() -> str:
    """docs/reference/commands.md: every verb, its options and examples."""
    from hpctrain.cli import build_parser
    from hpctrain.errors import exit_code_table

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help for choice in verbs._choices_actions}
    lines = ["# Command reference", "",
             "Every verb of `hpctrain`, generated from its parser (`python -m "
             "hpctrain.reference docs/reference`; a test fails when this page differs "
             "from the code). `hpctrain VERB --help` prints the same.", ""]
    for name, child in verbs.choices.items():
        lines += [*_verb(name, child, summaries.get(name)), ""]
    lines += ["## Exit codes", "", exit_code_table(markdown=True), ""]
    return "\n".join(lines).rstrip() + "\n"


PAGES = {RECIPE_PAGE: recipe_reference, COMMANDS_PAGE: commands_reference}


def main(folder: str) -> None:
    from hpctrain.writers import own_folder, write_whole

    place = own_folder(Path(folder))
    for name, make in PAGES.items():
        write_whole(place / name, make())
        print(f"wrote {place / name}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/reference")
