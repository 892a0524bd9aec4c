"""The CSV example from Python: your own training script, with hpctrain's engine under it.

    python examples/csv_images/fit_csv.py /scratch/mydata [key=value ...]
    torchrun --nproc-per-node 4 examples/csv_images/fit_csv.py /scratch/mydata
    srun --ntasks-per-node 4 python examples/csv_images/fit_csv.py /scratch/mydata resume=auto

Every process runs this script; hpctrain.fit finds its rank from torchrun or srun. The run
lands in runs/fit_csv-<time>/ like one of `hpctrain run`; exit status 75 after a preemption
signal means "run me again with resume=auto".
"""

import sys
from pathlib import Path

import torch
from csv_images import CsvImages  # this script's folder is on sys.path
from small_net import SmallNet

import hpctrain


def main(data: Path, overrides: list[str]) -> None:
    # The settings of recipe.yaml, written here; key=value from the command line win.
    config = hpctrain.load_config(
        overrides=overrides,
        data={"images": {"image_size": 32}},
        optim={"name": "adamw", "lr": 0.003, "weight_decay": 0.05},
        schedule={"name": "cosine"},
        train={"epochs": 10, "global_batch_size": 64})
    size = config.data.images.image_size
    train, val = CsvImages(data / "train.csv", size), CsvImages(data / "val.csv", size)
    torch.manual_seed(config.seed)  # the same initial weights in every process
    model = SmallNet(num_classes=len(train.classes), width=32)
    summary = hpctrain.fit(model, train, val, config)
    if summary is not None:  # rank 0
        print(f"best validation accuracy {summary['best_val_accuracy']:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
