"""Models and files of your own that the user-code tests import by reference, and the fixture
that forgets them between tests (a module of yours is imported once per process)."""

import textwrap
from pathlib import Path


NETS = '''
import torch
from torch import nn


class SmallNet(nn.Module):
    """A user's CNN: it asks for the classes and the image size by name."""

    def __init__(self, num_classes, image_size, width=8):
        super().__init__()
        self.seen = (num_classes, image_size, width)
        self.features = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, num_classes)

    def forward(self, images):
        return self.head(self.features(images))


def build_net(num_classes, width=8):
    return SmallNet(num_classes, 16, width)


def not_a_model(num_classes):
    return {"weights": None}


def fails(num_classes):
    raise ValueError("width must be even")


class Branchy(SmallNet):
    """It branches on a value of its activations, which a fake tensor does not have."""

    def forward(self, images):
        features = self.features(images)
        if features.mean().item() > 1e6:
            features = features / 2
        return self.head(features)
'''


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(textwrap.dedent(text))
    return folder / name
