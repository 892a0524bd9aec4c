"""The reference pages are the code's (issue 70): docs/reference/recipe.md and commands.md are
what hpctrain/reference.py generates from the configuration's schema and the command
line's parser, and every key and option they list says what it does."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import BaseModel

from hpctrain import reference
from hpctrain.cli import build_parser
from hpctrain.config import Config

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_the_committed_reference_is_what_the_code_generates(page):
    committed = (REFERENCE / page).read_text()
    assert committed == reference.PAGES[page](), (
        f"docs/reference/{page} differs from the code: run "
        "python -m hpctrain.reference docs/reference, and commit what it writes")


def _keys(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _keys(field.annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def test_every_recipe_key_says_what_it_does_and_is_in_the_reference():
    page = (REFERENCE / reference.RECIPE_PAGE).read_text()
    keys = dict(_keys(Config))
    assert len(keys) > 150
    assert not [key for key, field in keys.items() if not field.description]
    assert not [key for key in keys if f"| `{key}` |" not in page]


def _verbs(parser: argparse.ArgumentParser, name: str = "hpctrain"):
    yield name, parser
    for sub, child, _ in reference._children(parser):
        yield from _verbs(child, f"{name} {sub}")


def test_every_option_of_every_verb_says_what_it_does():
    verbs = dict(_verbs(build_parser()))
    assert {"hpctrain run", "hpctrain tune status", "hpctrain runs compare",
            "hpctrain config show"} <= set(verbs)
    silent = [f"{name} {action.option_strings or action.dest}"
              for name, parser in verbs.items() for action in parser._actions
              if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
              and not action.help]
    assert not silent, silent


def test_a_field_s_type_and_bounds_read_as_words():
    fields = dict(_keys(Config))
    assert reference.type_words(fields["train.batch_size"].annotation) == "a whole number"
    assert reference.type_words(fields["channels_last"].annotation) == "true, false or auto"
    assert reference.type_words(fields["data.images.mean"].annotation) == \
        "a list of 3, each a number"
    assert reference.type_words(fields["optim.name"].annotation) == \
        "one of sgd, adamw, lars, lamb"
    assert reference.type_words(fields["run_name"].annotation) == "text or null"
    assert reference.bounds_words(fields["seed"]) == ">= 0, <= 4,294,967,295"
    assert reference.bounds_words(fields["data.val_fraction"]) == "> 0, < 1"
