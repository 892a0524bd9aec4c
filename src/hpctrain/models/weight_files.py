"""Weight files read as tensors only, never as code.

A `.pth`/`.bin` weight file is a pickle, and a pickle can run any command as it is read.
torch.hub's `load_state_dict_from_url` (torchvision's weights) and timm's loader pass
`weights_only=False` to `torch.load`, so a file planted in a shared cache (TORCH_HOME on a
project's storage, as docs/pretrained.md advises) would run with the rights of every job that
reads it. Every library call that reads weights for hpctrain runs inside `tensors_only()`:
torch's own switch (TORCH_FORCE_WEIGHTS_ONLY_LOAD) makes each `torch.load` in it read with
the weights-only unpickler, which admits tensors and plain containers and refuses anything
else. That keeps each library's own rules for building its model from its weights (torchvision's
inception sets `aux_logits`, ViT its image size), which a state dict loaded beside the builder
would have to copy. Safetensors files hold no code; a damaged header (a length of 2^63,
offsets past the end) is the library's `SafetensorError`, refused here in one line too.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from hpctrain.errors import ConfigError

FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"  # read by torch.load at each call (torch >= 2.4)


def _safetensors_error() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError
    except ImportError:  # safetensors comes with timm and transformers, not with torch
        return ()
    return (SafetensorError,)


# what reading a weight file that is not whole, not weights or not a weight file raises
UNREADABLE = (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, KeyError,
              *_safetensors_error())


@contextmanager
def tensors_only() -> Iterator[None]:
    """Every `torch.load` inside reads tensors only, whatever its caller asks for."""
    before = os.environ.get(FORCE)
    os.environ[FORCE] = "1"
    try:
        with warnings.catch_warnings():  # a pickle's protocol, said before it is refused
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            yield
    finally:
        if before is None:
            os.environ.pop(FORCE, None)
        else:
            os.environ[FORCE] = before


def what_is_wrong(err: BaseException) -> str:
    """Why a weight file was refused, in a few words: the code a pickle would have run
    (`posix.system`), else the first line of the library's message."""
    text = str(err)
    code = re.search(r"GLOBAL ([\w.]+)", text)
    if code:
        return f"a pickle that would run {code.group(1)}, not only tensors; refused"
    if "Weights only load failed" in text:
        return "a pickle holding more than tensors; refused"
    first = text.strip().splitlines()[0][:200] if text.strip() else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def refused(setting: str, weights: str, err: BaseException, fix: str) -> ConfigError:
    """One line: the setting, the weights (their file named), why they were refused, the fix."""
    return ConfigError(f"{setting}: {weights} cannot be read ({what_is_wrong(err)}); {fix}")
