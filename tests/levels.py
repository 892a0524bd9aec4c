"""A dataset of your own, importable by a process of its own (a torchrun script, a
forkserver's worker): uint8 images whose grey level is the class."""

import numpy as np
from torch.utils.data import Dataset, IterableDataset


class Stream(IterableDataset):
    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __iter__(self):
        return (self.dataset[i] for i in range(len(self.dataset)))


class Levels(Dataset):
    """uint8 16 px images whose grey level is the class."""

    classes = ["dark", "mid", "light"]

    def __init__(self, count: int, seed: int, bad_index: int | None = None):
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, 3, count)
        self.noise = rng.normal(0, 10, (count, 16, 16, 3))
        self.bad_index = bad_index

    def __len__(self):
        return len(self.labels)

    def as_stream(self) -> IterableDataset:
        return Stream(self)

    def __getitem__(self, index):
        image = np.clip(40 + 80 * self.labels[index] + self.noise[index], 0, 255)
        if index == self.bad_index:
            image = image[:, :, :1]  # one channel where three are expected
        return image.astype(np.uint8), int(self.labels[index])
