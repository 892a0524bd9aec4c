"""How loader workers start, per data kind (issue 65): fork against the forkserver (the new
default, data/worker_start.py) and spawn, with persistent workers, as a run builds them.

For each data kind (the shipped recipes default, tiny-lm and pointnet, and your own tensors
from a file.py factory) and each start method, a fresh process builds the run's loaders
(data.loader.build_data, `--workers` workers) and times: the first training batch (the
workers' start, and for the forkserver the server's own start, which imports torch once,
overlapped with nothing here), the rest of `--batches` batches, the first batch of the second
epoch (persistent workers: no start), and one pass of the validation loader (batch buffers
start their workers again for each pass). The table gives each against fork's as a ratio.

    python benchmarks/worker_start.py                 # every kind, fork / forkserver / spawn
    python benchmarks/worker_start.py --kinds default --batches 10 --methods fork forkserver
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = {"default": ["data.shapes.num_train=2048", "data.shapes.num_val=512"],
         "tiny-lm": [], "pointnet": [], "tensors": []}
TENSORS = textwrap.dedent("""\
    import torch
    from torch.utils.data import Dataset

    class Blobs(Dataset):
        def __init__(self, count, seed):
            g = torch.Generator().manual_seed(seed)
            self.y = torch.randint(0, 4, (count,), generator=g)
            self.x = torch.randn(count, 16, generator=g) + self.y[:, None]

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], int(self.y[i])

    def blobs():
        return Blobs(8192, 0), Blobs(2048, 1)

    def mlp():
        return torch.nn.Linear(16, 4)
    """)
CHILD = textwrap.dedent("""\
    import json, os, sys, time

    def main():
        began = time.perf_counter()
        import torch
        from hpctrain.config import load_config
        from hpctrain.data.loader import build_data
        recipe, batches, overrides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
        config = load_config(recipe, overrides)
        data = build_data(config.data, config.train.batch_size, 0, torch.device("cpu"))
        data.train_sampler.set_epoch(0, config.data.images.image_size)
        marks = {"build": time.perf_counter() - began}
        t = time.perf_counter(); batches_of = iter(data.train_loader); next(batches_of)
        marks["first_batch"] = time.perf_counter() - t
        t = time.perf_counter()
        for _, _ in zip(range(batches - 1), batches_of):
            pass
        marks["batches"] = time.perf_counter() - t
        for _ in batches_of:
            pass
        data.train_sampler.set_epoch(1, config.data.images.image_size)
        t = time.perf_counter(); next(iter(data.train_loader))
        marks["second_epoch_first"] = time.perf_counter() - t
        t = time.perf_counter()
        for _ in data.val_loader:
            pass
        marks["validation_pass"] = time.perf_counter() - t
        print(json.dumps({**marks, "total": time.perf_counter() - began}), flush=True)
        os._exit(0)

    if __name__ == "__main__":
        main()
    """)


def measure(kind: str, method: str, workers: int, batches: int, folder: Path) -> dict:
    """One process building `kind`'s loaders with workers started by `method`: its marks."""
    recipe, overrides = kind, list(KINDS[kind])
    if kind == "tensors":
        (folder / "blobs.py").write_text(TENSORS)
        recipe = "default"
        overrides = [f"data.dataset={folder / 'blobs.py'}:blobs", "task=classification",
                     f"model.name={folder / 'blobs.py'}:mlp"]
    overrides += [f"data.num_workers={workers}", f"data.worker_start={method}",
                  f"output_dir={folder / 'runs'}", f"data.shapes.cache_dir={folder / 'shapes'}"]
    script = folder / "child.py"
    script.write_text(CHILD)
    done = subprocess.run([sys.executable, str(script), recipe, str(batches), *overrides],
                          capture_output=True, text=True, timeout=300, cwd=folder)
    if done.returncode != 0:
        raise SystemExit(f"{kind} with {method}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--methods", nargs="+", default=["fork", "forkserver", "spawn"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    columns = ("first_batch", "batches", "second_epoch_first", "validation_pass", "total")
    print(f"{'kind':<9} {'start':<11}" + "".join(f"{c:>20}" for c in columns))
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for kind in args.kinds:
            measure(kind, "fork", args.workers, 2, folder)  # the data made once, untimed
            rows = {m: measure(kind, m, args.workers, args.batches, folder)
                    for m in args.methods}
            base = rows.get("fork")
            for method, marks in rows.items():
                cells = "".join(f"{marks[c]:>9.3f} s" + (f" ({marks[c] / base[c]:4.2f}x)"
                                if base and base[c] else " " * 8) for c in columns)
                print(f"{kind:<9} {method:<11}{cells}", flush=True)


if __name__ == "__main__":
    main()
