"""Built-in small networks for 8-64 px images.

`resnet_small` is a ResNet-style net in the spirit of the fast CIFAR-10 nets (ResNet-9,
airbench): few wide stages, max-pool downsampling and a residual block per stage, so it trains
to high accuracy in few epochs and runs at hundreds of images/s even on two CPU cores.
`tiny_cnn` has a few thousand parameters and exists for tests and smoke runs.
`norm="group"` swaps BatchNorm for GroupNorm, whose output does not depend on the batch: then
N processes with batch b compute exactly what one process with batch N x b computes.
"""

from __future__ import annotations

import torch
from torch import nn

NORMS = {"batch": nn.BatchNorm2d, "group": lambda c: nn.GroupNorm(max(1, c // 4), c)}


def conv_bn(c_in: int, c_out: int, norm: str = "batch") -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                         NORMS[norm](c_out), nn.ReLU(inplace=True))


class ResidualBlock(nn.Module):
    """Two 3x3 conv-BN-ReLU layers with an identity shortcut."""

    def __init__(self, channels: int, norm: str = "batch"):
        super().__init__()
        self.body = nn.Sequential(conv_bn(channels, channels, norm),
                                  conv_bn(channels, channels, norm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class Stage(nn.Module):
    """Widen, halve the resolution, then one residual block."""

    def __init__(self, c_in: int, c_out: int, norm: str = "batch"):
        super().__init__()
        self.down = nn.Sequential(conv_bn(c_in, c_out, norm), nn.MaxPool2d(2))
        self.block = ResidualBlock(c_out, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.down(x))


class ResNetSmall(nn.Module):
    def __init__(self, num_classes: int, widths: tuple[int, ...] = (16, 32, 64),
                 in_channels: int = 3, norm: str = "batch"):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r}: choose one of {', '.join(NORMS)}")
        self.stem = conv_bn(in_channels, widths[0], norm)
        self.stages = nn.Sequential(*(Stage(a, b, norm) for a, b in zip(widths, widths[1:])))
        self.head = nn.Sequential(nn.AdaptiveMaxPool2d(1), nn.Flatten(),
                                  nn.Linear(widths[-1], num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def resnet_small(num_classes: int, widths=(16, 32, 64), norm: str = "batch") -> nn.Module:
    return ResNetSmall(num_classes, tuple(widths), norm=norm)


def tiny_cnn(num_classes: int, width: int = 8, norm: str = "batch") -> nn.Module:
    return ResNetSmall(num_classes, (width, width), norm=norm)
