"""A dataset of your own: a CSV of image paths and labels (examples/csv_images/README.md)."""

import csv
from pathlib import Path

import numpy as np
from PIL import Image
from torch.utils.data import Dataset


class CsvImages(Dataset):
    """Rows `path,label` (a path relative to the CSV's folder, a label 0..K-1)."""

    def __init__(self, table: Path, image_size: int):
        with open(table, newline="") as f:
            self.rows = [(table.parent / path, int(label)) for path, label in csv.reader(f)]
        self.classes = sorted({label for _, label in self.rows})
        self.size = image_size

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        path, label = self.rows[index]
        image = Image.open(path).convert("RGB").resize((self.size, self.size))
        return np.array(image), label  # uint8 (H, W, 3): hpctrain normalises it on the GPU


def make(path, image_size):
    """hpctrain calls this with data.path and data.images.image_size."""
    root = Path(path)
    return CsvImages(root / "train.csv", image_size), CsvImages(root / "val.csv", image_size)
