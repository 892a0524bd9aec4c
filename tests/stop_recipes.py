"""What the stop tests train and count: a dataset that signals its run at a step, the
evaluations and the training steps a run recorded."""

import json
from pathlib import Path

SIGNALLING = f"{Path(__file__).parent / 'fixtures' / 'signalling.py'}:stripes_signalling"


VAL = 200  # samples per evaluation


CHECKED = 3  # samples drawn from each split by the check before training (user_datasets.py)


def stripes(tiny, name: str, *extra: str) -> list[str]:
    """A 3-epoch run of the stripes set (an evaluation per epoch: steps 20, 40 and 60)."""
    return [o for o in tiny(f"run_name={name}", "train.epochs=3", "train.log_every=5",
                            "data.images.image_size=8", "data.num_workers=0")
            if not o.startswith("data.shapes")] + [f"data.dataset={SIGNALLING}", *extra]


def evaluations(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "eval"]


def trains(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]
