"""The built-in `arithmetic` corpus: sums and differences as text, for language models.

`hpctrain run tiny-lm` must train a language model with nothing downloaded, on a corpus where
something beyond the loss says that the model learned. Each document is one problem, such as
`37+45=082`; the answer is the span after `=`, and a model that predicts every answer token
right under teacher forcing also gets it right when it generates greedily (each token it
would generate is the one it was fed). The validation problems never appear in training, so
an answer accuracy near 1 means the model learned to add, not to remember.

Written once into the cache as a byte-level token pack (token_pack.py), like the `shapes` images:
the folder name holds every parameter, and a pack is only ever published complete.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens
from hpctrain.data.tokens.token_pack import MANIFEST
from hpctrain.errors import DataError
from hpctrain.writers import fresh_folder, write_whole

FORMAT_VERSION = 2
ANSWER_START = "="  # the answer is the text after this, up to the end of the document


def problems(max_operand: int, operations: str) -> list[str]:
    """Every distinct problem, in a fixed order, written with a fixed number of digits (zeros
    in front, as in 07+45=052): each digit keeps its place, which small models learn from far
    faster than from numbers of varying length."""
    results = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    digits = len(str(max_operand))
    answer = {op: len(str(max(abs(results[op](a, b)) for a in (0, max_operand)
                              for b in (0, max_operand)))) for op in operations}
    return [f"{a:0{digits}d}{op}{b:0{digits}d}={_signed(results[op](a, b), answer[op])}"
            for op in operations for a in range(max_operand + 1)
            for b in range(max_operand + 1)]


def _signed(value: int, digits: int) -> str:
    return ("-" if value < 0 else "") + f"{abs(value):0{digits}d}"


def ensure_arithmetic(root: Path, seed: int, num_train: int, num_val: int, max_operand: int,
                      operations: str) -> Path:
    """The token pack of the corpus under `root`, generated on first use.

    Validation holds `num_val` distinct problems; training draws `num_train` documents (with
    repeats) from all the others."""
    folder = Path(root) / (f"arithmetic-v{FORMAT_VERSION}-s{seed}-n{num_train}-{num_val}-"
                           f"max{max_operand}-{''.join(f'{ord(c):x}' for c in operations)}")
    if (folder / MANIFEST).is_file():
        return folder
    every = problems(max_operand, operations)
    if num_val >= len(every):
        raise DataError(f"data.arithmetic.num_val={num_val} leaves no problem for training: "
                        f"there are {len(every)} distinct problems up to max_operand="
                        f"{max_operand}")
    rng = random.Random(seed)
    rng.shuffle(every)
    val, train = every[:num_val], every[num_val:]
    tmp = fresh_folder(folder)
    try:
        for split, texts in (("train", [rng.choice(train) for _ in range(num_train)]),
                             ("val", val)):
            (tmp / "source" / split).mkdir(parents=True)
            write_whole(tmp / "source" / split / "problems.jsonl",
                        "".join(json.dumps({"text": text}) + "\n" for text in texts))
        pack_tokens(tmp / "source", tmp / "pack", TokenPackOptions(), workers=1,
                    log=lambda _: None)
    except BaseException:  # nothing half-made left beside the cache
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if (folder / MANIFEST).is_file():  # another process finished first: keep theirs
        shutil.rmtree(tmp)
        return folder
    shutil.rmtree(folder, ignore_errors=True)  # an interrupted earlier generation
    (tmp / "pack").rename(folder)
    shutil.rmtree(tmp)
    return folder
