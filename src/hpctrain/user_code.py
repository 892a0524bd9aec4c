"""User code named in a recipe: `package.module:attribute` or `path/to/file.py:attribute`.

Anything of the form `X:Y` whose X is not one of hpctrain's model sources (torchvision, timm,
hpctrain, hf) names user code. A file is imported as the module named after it, with its folder
put first on sys.path: DataLoader workers (multiprocessing hands sys.path to spawn and
forkserver children; fork inherits it) and torchrun children (which load the recipe again)
then import it the same way, and what it defines pickles by reference. A relative file path is
made absolute when the recipe is loaded (config.absolute_code_paths), so the run directory's
config.yaml, torchrun children and Slurm jobs all name the same file.

`given:NAME` names an object handed to `hpctrain.fit` in this process (api.py): the run's
config.yaml records what it was, but only the script that made it can make it again.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any

from hpctrain.errors import ConfigError

MODEL_SOURCES = ("torchvision", "timm", "hpctrain", "hf")
GIVEN = "given"
_given: dict[str, Any] = {}  # reference -> a factory of what was handed to hpctrain.fit


def given(label: str) -> str:
    """The reference `given:label` of an object handed to hpctrain.fit."""
    return f"{GIVEN}:{label}"


def give(reference: str, factory) -> None:
    """From now on in this process, `load(reference)` is `factory`."""
    _given[reference] = factory


def is_code_reference(name: str) -> bool:
    """Whether `name` names user code (`module:attribute`, `file.py:attribute`)."""
    target, colon, attribute = name.rpartition(":")
    return bool(colon and target and attribute) and target not in MODEL_SOURCES


def absolute(reference: str, folder: Path) -> str:
    """`file.py:attribute` with a relative file made absolute against `folder`; a module
    reference unchanged."""
    target, _, attribute = reference.rpartition(":")
    if not target.endswith(".py") or Path(target).expanduser().is_absolute():
        return reference
    return f"{(folder / target).resolve()}:{attribute}"


def why(err: BaseException) -> str:
    """The exception's last line and where in the user's code it was raised."""
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(err.__traceback__)
              if "importlib" not in f.filename and f.filename != __file__]
    if isinstance(err, SyntaxError) and err.filename:
        frames.append((err.filename, err.lineno))
    where = f"{Path(frames[-1][0]).name}:{frames[-1][1]}" if frames else None
    last = traceback.format_exception_only(type(err), err)[-1].strip()
    return last + (f" (at {where})" if where else "")


def _module_of(target: str, what: str, reference: str):
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"{what}: {reference}: no file {path} (a relative path in a "
                              "recipe is read from the recipe's folder, on the command line "
                              "from the current directory)")
        name = path.stem
        loaded = sys.modules.get(name)
        if loaded is not None and Path(getattr(loaded, "__file__", None) or "").resolve() \
                != path:
            raise ConfigError(f"{what}: {reference}: a module named {name!r} is already "
                              f"imported from {getattr(loaded, '__file__', 'built-in')}; "
                              "rename the file")
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
    else:
        name = target
        if str(Path.cwd()) not in sys.path and "" not in sys.path:
            sys.path.append(str(Path.cwd()))  # as `python -m` would: the working directory
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as err:
        hint = ""
        if isinstance(err, ModuleNotFoundError) and err.name == name.split(".")[0]:
            hint = (f"; is it installed in this environment or on PYTHONPATH? (the model "
                    f"sources built in are {', '.join(s + ':' for s in MODEL_SOURCES)})")
        raise ConfigError(f"{what}: {reference} does not import: {why(err)}{hint}") from None


def load(reference: str, what: str) -> Any:
    """The object `reference` names; ConfigError naming `what` (the recipe key) when its
    module does not import or has no such attribute."""
    target, _, attribute = reference.rpartition(":")
    if target == GIVEN:
        if reference not in _given:
            raise ConfigError(f"{what}: {reference} was handed to hpctrain.fit() by the "
                              "script that made this run, and only that script can make it "
                              "again: run the script (with resume=auto to continue the run), "
                              "or name a factory (package.module:build, path/to/file.py:build)")
        return _given[reference]
    value = _module_of(target, what, reference)
    for part in attribute.split("."):
        if not hasattr(value, part):
            known = [n for n in dir(value) if not n.startswith("_")]
            hint = difflib.get_close_matches(part, known, n=3)
            raise ConfigError(f"{what}: {reference}: {target} has no {part!r}"
                              + (f"; close matches: {', '.join(hint)}" if hint else ""))
        value = getattr(value, part)
    return value


def facts_taken(factory, facts: dict) -> dict:
    """The facts of the data (num_classes, image_size, ...) that `factory` names as parameters
    and that are known (not None)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: kwargs only
        return {}
    return {k: v for k, v in facts.items() if k in parameters and v is not None}


def call_factory(factory, what: str, reference: str, facts: dict, kwargs: dict):
    """`factory(**the facts it names, **kwargs)`. An exception it raises becomes a
    ConfigError naming the recipe key, the arguments, the exception's last line and where it
    was raised."""
    given = {k: v for k, v in facts_taken(factory, facts).items() if k not in kwargs}
    arguments = ", ".join(f"{k}={v!r}" for k, v in {**given, **kwargs}.items())
    try:
        return factory(**given, **kwargs)
    except (Exception, SystemExit) as err:
        raise ConfigError(f"{what}: {reference}({arguments}) failed: {why(err)}") from None
