"""A model of your own (examples/csv_images/README.md)."""

from torch import nn


class SmallNet(nn.Module):
    """hpctrain passes num_classes because the constructor names it (image_size and
    vocab_size likewise), and model.kwargs (width). GroupNorm rather than BatchNorm: its
    statistics are per sample, so 2 processes train exactly as 1 does on the CPU too."""

    def __init__(self, num_classes, width=32):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.GroupNorm(8, width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.GroupNorm(8, 2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, images):
        return self.head(self.body(images))
