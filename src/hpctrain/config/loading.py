"""Loading a recipe: YAML, `key=value` overrides, validation whose errors name the key, the
value given and what is allowed (a `ConfigError`, exit code 2), and writing it back.
"""

from __future__ import annotations

import copy
import difflib
import reprlib
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hpctrain import user_code
from hpctrain.config.recipe import Config
from hpctrain.errors import ConfigError
from hpctrain.readers import LimitBroken, MiB, Unreadable, load_yaml, read_capped, yaml_problem


def shipped_recipes() -> dict[str, Path]:
    """Name -> path of the recipes shipped inside the package."""
    folder = resources.files("hpctrain") / "recipes"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def _recipe_path(recipe: str) -> Path:
    path = Path(recipe).expanduser()
    shipped = shipped_recipes()
    if path.is_file():
        return path
    if path.suffix in (".yaml", ".yml") or (path.exists() and recipe not in shipped):
        raise ConfigError(f"recipe file {recipe!r} does not exist" if not path.exists() else
                          f"recipe {recipe!r} is a folder, not a file: give its .yaml file")
    if recipe in shipped:  # a folder of that name here (autotune's, a run's) is no recipe
        return shipped[recipe]
    hint = difflib.get_close_matches(recipe, shipped, n=1)
    raise ConfigError(
        f"unknown recipe {recipe!r}: not a file and not a shipped recipe"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
        + f". Shipped recipes: {', '.join(sorted(shipped))}; or give a path to a .yaml file.")


RECIPE_CAP = 4 * MiB  # a recipe's file (the shipped ones are 1-3 KiB)


def read_yaml_mapping(path: Path, what: str = "a recipe") -> dict:
    """A YAML file that must hold a mapping (a recipe, cluster profiles), or a ConfigError.
    An empty file is refused: a recipe saved before it was written would train the defaults.
    Read within the limits of readers.py: an alias bomb, nesting past 64 levels, a key given
    twice or an integer of 100,000 digits is one line naming it, in bounded time."""
    try:
        data = load_yaml(read_capped(path, RECIPE_CAP).decode())
    except LimitBroken as err:
        raise ConfigError(f"{path}: refused: {yaml_problem(err)}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(err)}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); "
                          f"{what} is a YAML text file") from None
    except Unreadable as err:
        raise ConfigError(f"{path} {err}; {what} is a YAML text file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    if data is None:
        raise ConfigError(f"{path} is empty (or only comments): {what} holds at least one "
                          "setting")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what} must be a mapping of keys, got "
                          f"{type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value), the value parsed as YAML (so 1e-3, true, [1,2])."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form key=value "
                          "(for example train.batch_size=256)")
    try:
        value = load_yaml(raw) if raw != "" else None
    except LimitBroken as err:
        raise ConfigError(f"override {key}=...: {yaml_problem(err)}") from None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _set_dotted(tree: dict, keys: list[str], value: Any, text: str) -> None:
    node = tree
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {text!r}: {'.'.join(keys[:i + 1])} is a value, "
                              "not a section")
        node = child
    node[keys[-1]] = value


# keys that moved: the old one is still read, as the new one, and said once per process
RENAMED = {f"data.{name}": f"data.images.{name}" for name in (  # issue 66: images' own
    "image_size", "val_image_size", "val_resize_ratio", "mean", "std", "decode", "cache",
    "on_bad_image")}
_SAID: set[str] = set()


def _renamed(keys: list[str]) -> list[str]:
    """An override's keys, under their new name where RENAMED moved them."""
    for old, new in RENAMED.items():
        parts = old.split(".")
        if keys[:len(parts)] == parts:
            _say_renamed(old, new)
            return [*new.split("."), *keys[len(parts):]]
    return keys


def current_names(tree: dict) -> dict:
    """A configuration saved under RENAMED's old names (a checkpoint's, an older run's
    config.yaml) under today's, quietly: it was not the user's to write again."""
    tree = copy.deepcopy(tree)
    _renamed_tree(tree, "the saved configuration", say=False)
    return tree


def _renamed_tree(tree: dict, source: str, say: bool = True) -> None:
    """A recipe's RENAMED keys moved to their new place; both given is refused."""
    for old, new in RENAMED.items():
        *parents, last = old.split(".")
        node = tree
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            continue
        if any(key == new or key.startswith(new + ".") for key in flatten(tree)):
            raise ConfigError(f"{source} gives both {old} and {new}: {old} is the old name "
                              f"of {new}; keep {new}")
        if say:
            _say_renamed(old, new)
        _set_dotted(tree, new.split("."), node.pop(last), old)


def _say_renamed(old: str, new: str) -> None:
    if old not in _SAID:
        _SAID.add(old)
        print(f"hpctrain: {old} is now {new} (read as {new}; write it so)", file=sys.stderr)


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            keys += _known_keys(sub, prefix + name + ".")
    return keys


def _explain(err: ValidationError, source: str) -> ConfigError:
    """Turn pydantic's report into one line per problem: key, value given, what is allowed."""
    lines = []
    known = _known_keys(Config)
    for problem in err.errors():
        # pydantic adds the union member ('int', 'literal[...]') to the location: drop those
        loc = [str(p) for p in problem["loc"]]
        loc = [p for p in loc if not (p.startswith(("literal[", "function-")) or p in
                                      ("int", "bool", "str", "float"))]
        key = ".".join(loc) or "(recipe)"
        if problem["type"] == "extra_forbidden":
            hint = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            lines.append(f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint
                                                    else ""))
            continue
        value = problem.get("input")
        allowed = problem["msg"]
        expected = problem.get("ctx", {}).get("expected")
        if expected:
            allowed = f"expected {expected}"
        shown = "" if isinstance(value, dict) else f" = {SHOWN.repr(value)}"
        lines.append(f"{key}{shown}: {allowed[:300]}")
    return ConfigError(f"invalid configuration ({source}):\n  " + "\n  ".join(lines))


# a value in an error message: a few items and characters, however large the value
SHOWN = reprlib.Repr()
SHOWN.maxlevel, SHOWN.maxlist, SHOWN.maxdict, SHOWN.maxstring, SHOWN.maxother = 2, 4, 4, 60, 60
SHOWN.maxlong = 40

CODE_KEYS = ("model.name", "data.dataset", "data.collate", "task.loss",  # may name user code
             "task.metrics.*", "task.compute_metrics", "lightning.callbacks.*.name")


def _code_slots(tree: dict):
    """(section, name, recipe key) of every CODE_KEYS place in a recipe's tree (`*`: each
    key of a mapping, each item of a list)."""
    for key in CODE_KEYS:
        yield from _slots(tree, key.split("."), [])


def _slots(section, parts: list[str], path: list[str]):
    head, rest = parts[0], parts[1:]
    if head != "*":
        names = [head] if isinstance(section, dict) else []
    else:
        names = list(range(len(section))) if isinstance(section, list) else \
            list(section) if isinstance(section, dict) else []
    for name in names:
        if not rest:
            yield section, name, ".".join([*path, str(name)])
        elif isinstance(section, list) or name in section:
            yield from _slots(section[name], rest, [*path, str(name)])


def code_references(config: "Config") -> list[tuple[str, str]]:
    """(recipe key, reference) for every piece of user code the configuration names."""
    return [(key, section[name]) for section, name, key in _code_slots(config.model_dump())
            if isinstance(section.get(name), str) and
            user_code.is_code_reference(section[name])]


def _absolute_code_paths(tree: dict, folder: Path) -> None:
    """A `file.py:name` in the recipe is read from the recipe's folder (on the command line,
    from the current directory), and kept absolute from here on."""
    for section, name, _ in _code_slots(tree):
        if isinstance(section.get(name), str):
            section[name] = user_code.absolute(section[name], folder)


def load_config(recipe: str | Path | None = None, overrides: list[str] = (),
                settings: dict | None = None) -> Config:
    """Resolve a recipe (path or shipped name, default 'default'), then `settings` (Python
    values, nested {"train": {"epochs": 3}} or dotted {"train.epochs": 3}), then overrides
    (`key=value` text, as on the command line): the later wins."""
    path = _recipe_path(str(recipe or "default"))
    tree = read_yaml_mapping(path)
    tree.setdefault("name", path.stem)
    _absolute_code_paths(tree, path.parent)
    return _validated(tree, _changes(settings, overrides), f"recipe {path}")


def from_defaults(overrides: list[str] = (), settings: dict | None = None) -> Config:
    """hpctrain's defaults (the fields' own, no recipe), then settings and overrides as for
    load_config: the base of a script that brings its own model and data."""
    return _validated({}, _changes(settings, overrides), "hpctrain's defaults")


def with_settings(config: Config, settings: dict) -> Config:
    """`config` with `settings` (as for load_config) applied and validated again; what the
    user set stays told (`Config.told`), the settings' keys are told too."""
    return _validated(config.model_dump(mode="json"), _changes(settings), "the configuration",
                      config.told_keys)


def _changes(settings: dict | None, overrides: list[str] = ()) -> list[tuple[list[str], Any,
                                                                          str]]:
    """(keys, value, as told) of Python settings, then of key=value overrides."""
    return [*((key.split("."), value, f"{key}={value!r}")
              for key, value in flatten(settings or {}).items()),
            *((*parse_override(text), text) for text in overrides)]


def _validated(tree: dict, changes: list[tuple[list[str], Any, str]], source: str,
               told: frozenset[str] | None = None) -> Config:
    """`tree` with the changes (keys, value, as told) applied, as a Config. A file path that
    names user code is read from the current directory; a per-device train.batch_size
    replaces the recipe's global one. `told`: the keys the user set (None: the tree's)."""
    _renamed_tree(tree, source)
    told = set(flatten(tree) if told is None else told)
    changes = [(_renamed(keys), value, text) for keys, value, text in changes]
    for keys, value, text in changes:
        if isinstance(value, str) and (".".join(keys) in CODE_KEYS or
                                       ".".join(keys[:-1]) + ".*" in CODE_KEYS):
            value = user_code.absolute(value, Path.cwd())
        _set_dotted(tree, keys, value, text)
    changed = {".".join(keys) for keys, _, _ in changes}
    if "train.batch_size" in changed and "train.global_batch_size" not in changed:
        tree.get("train", {}).pop("global_batch_size", None)  # the per-device batch asked for
    if changes:
        source += " with overrides " + " ".join(
            text if len(text) <= 80 else text[:77] + "..." for _, _, text in changes)
    try:
        config = Config.model_validate(tree)
    except ValidationError as err:
        raise _explain(err, source) from None
    config._told = frozenset(told | changed)
    return config


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested mapping as {'a.b.c': value}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
