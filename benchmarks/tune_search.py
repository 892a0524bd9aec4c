"""hpctrain tune on a tiny recipe: TPE against random search over the learning rate and the
weight decay (the best value after K trials, over several seeds), and the share of training
steps the median pruner saves.

The recipe: a tiny CNN on 8 x 8 images of two noisy stripes (this file's `stripes`; the best
accuracy a classifier can reach on them is about 0.85), 3 epochs of 10 steps, an evaluation
every half epoch. Each series runs `hpctrain tune` as a user does (trials as subprocesses,
--parallel 2); the baseline is random search without pruning, every other row a ratio to it.

    python benchmarks/tune_search.py                      # 12 trials x 3 seeds per series
    python benchmarks/tune_search.py --trials 20 --seeds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SERIES = (("random", "none"), ("tpe", "none"), ("tpe", "median"))
SPACE = ("optim.lr=loguniform(1e-4,3)", "optim.weight_decay=loguniform(1e-6,0.1)")
STEPS_PER_TRIAL = 30  # 320 images / batch 32 x 3 epochs


def stripes(seed: int = 0):
    """Class 0 a little brighter on the left half, class 1 on the right, under noise."""
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(seed)

    def images(count: int) -> TensorDataset:
        labels = torch.randint(0, 2, (count,), generator=generator)
        pixels = torch.randn(count, 3, 8, 8, generator=generator)
        pixels[labels == 0, :, :, :4] += 0.12
        pixels[labels == 1, :, :, 4:] += 0.12
        made = TensorDataset(pixels, labels)
        made.num_classes = 2
        return made

    return images(320), images(400)


def search(folder: Path, sampler: str, pruner: str, trials: int, seed: int) -> dict:
    recipe = [f"output_dir={folder}", f"data.dataset={Path(__file__).resolve()}:stripes",
              "data.images.image_size=8", "data.num_workers=0", "model.name=hpctrain:tiny_cnn",
              "train.batch_size=32", "train.epochs=3", "train.eval_every_epochs=0.5",
              "train.log_every=5", "tensorboard=false", "report=false"]
    space = [arg for spec in SPACE for arg in ("--space", spec)]
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "tune", "default", *recipe, *space,
         "--trials", str(trials), "--sampler", sampler, "--pruner", pruner, "--seed",
         str(seed), "--parallel", "2", "--dir", str(folder / "search"), "--json"],
        capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"hpctrain tune failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def best_after(result: dict, k: int) -> float:
    """The best completed value among the first k trials (0.5: chance, when none did)."""
    values = [t["value"] for t in result["trials"][:k] if t["state"] == "complete"]
    return max(values, default=0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cache-dir", default=None, help="where the searches are written")
    parser.add_argument("--series", default=",".join(f"{s}/{p}" for s, p in SERIES),
                        help="sampler/pruner pairs, the first the baseline")
    args = parser.parse_args()
    root = Path(args.cache_dir or tempfile.mkdtemp(prefix="tune-bench-"))
    half = max(1, args.trials // 2)
    rows = []
    for sampler, pruner in (pair.split("/") for pair in args.series.split(",")):
        results = [search(root / f"{sampler}-{pruner}-{seed}", sampler, pruner, args.trials,
                          seed) for seed in range(args.seeds)]
        rows.append({
            "series": f"{sampler}, pruner {pruner}",
            "best_half": statistics.mean(best_after(r, half) for r in results),
            "best": [best_after(r, args.trials) for r in results],
            "steps": statistics.mean(r["steps_trained"] for r in results),
            "pruned": statistics.mean(r["states"].get("pruned", 0) for r in results)})
    base = rows[0]
    full = args.trials * STEPS_PER_TRIAL
    print(f"tiny recipe (stripes, tiny CNN, {STEPS_PER_TRIAL} steps a trial), space: "
          f"{' '.join(SPACE)}; {args.trials} trials x {args.seeds} seeds per series")
    print(f"{'series':<24}{f'best@{half}':>9}{f'best@{args.trials}':>9}{'sd':>7}"
          f"{'ratio':>7}{'pruned':>8}{'steps':>8}{'of full':>9}")
    for row in rows:
        best = statistics.mean(row["best"])
        spread = statistics.stdev(row["best"]) if len(row["best"]) > 1 else 0.0
        print(f"{row['series']:<24}{row['best_half']:>9.3f}{best:>9.3f}{spread:>7.3f}"
              f"{best / statistics.mean(base['best']):>7.3f}{row['pruned']:>8.1f}"
              f"{row['steps']:>8.0f}{row['steps'] / full:>9.2f}")
    print("best@K: the best validation accuracy after the first K trials, mean over seeds; "
          "ratio: to random search; of full: steps trained / (trials x steps a trial)")


if __name__ == "__main__":
    main()
