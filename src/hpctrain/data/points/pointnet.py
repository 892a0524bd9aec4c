"""PointNet (Qi et al., 2017) for point-cloud classification.

A cloud is an unordered set of points, so every point goes through the same MLP ("shared
MLP"), and one symmetric function, a max over the points, makes the cloud's feature: the
output does not depend on the order of the points. Two small networks (T-Nets) predict a 3x3
transform of the input points and a 64x64 transform of the point features, so that the
classifier sees the cloud in a canonical pose; the feature transform is kept close to
orthogonal by a regulariser, ||I - A A^T||^2, added to the loss.

The shared MLP is a Linear layer over the last dimension of (batch, points, channels), with
BatchNorm over every point of the batch: what the paper's 1x1 convolutions compute, as one
matrix multiply per layer with no transposes. The model takes (batch, points, 3) and returns
(logits, regulariser) while training, logits alone in evaluation; the point-cloud task adds the
regulariser to the loss.

`width` scales every layer (1.0: the paper's 64-128-1024 and 3.5 M parameters;
`pointnet_small` is 0.25, 0.22 M parameters, which trains in minutes on two CPU cores).
"""

from __future__ import annotations

import torch
from torch import nn

REGULARISER_WEIGHT = 0.001  # the paper's weight on the feature transform's regulariser


class PointMLP(nn.Module):
    """Linear + BatchNorm + ReLU for every point: (batch, points, c_in) -> (..., c_out)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.linear = nn.Linear(c_in, c_out, bias=False)
        self.norm = nn.BatchNorm1d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return torch.relu(self.norm(y.flatten(0, -2)).view_as(y))


def max_pool(x: torch.Tensor) -> torch.Tensor:
    """The cloud's feature: each channel's maximum over the points, (batch, points, c) ->
    (batch, c). max, not amax: amax's backward finds every point equal to the maximum and
    shares the gradient among them (a comparison, a conversion, a sum and a product over the
    whole (batch, points, c) tensor), where max's puts it at the one index it kept. Either way
    a ReLU feature of 0 passes no gradient back, and points that tie above 0 are copies of one
    point (point dropout's): the weights' gradients are the same, to rounding. The pointnet
    recipe's steps are 1.2x faster on the CPU (docs/benchmarks.md)."""
    return x.max(dim=1).values


def shared_mlp(widths: list[int]) -> nn.Sequential:
    return nn.Sequential(*(PointMLP(a, b) for a, b in zip(widths, widths[1:])))


def head(widths: list[int], out: int, dropout: float = 0.0) -> nn.Sequential:
    """The fully connected layers after the max pool (BatchNorm, ReLU, dropout), then `out`."""
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b, bias=False), nn.BatchNorm1d(b), nn.ReLU(inplace=True)]
        if dropout:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(widths[-1], out))


class TNet(nn.Module):
    """Predicts a k x k transform of its input from the whole cloud; starts as the identity."""

    def __init__(self, k: int, scale: float):
        super().__init__()
        c = lambda n: max(8, int(n * scale))
        self.k = k
        self.points = shared_mlp([k, c(64), c(128), c(1024)])
        self.transform = head([c(1024), c(512), c(256)], k * k)
        nn.init.zeros_(self.transform[-1].weight)
        nn.init.zeros_(self.transform[-1].bias)
        self.register_buffer("identity", torch.eye(k).flatten(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = max_pool(self.points(x))
        return (self.transform(pooled) + self.identity).view(-1, self.k, self.k)


class PointNet(nn.Module):
    def __init__(self, num_classes: int, width: float = 1.0, input_transform: bool = True,
                 feature_transform: bool = True, dropout: float = 0.3):
        super().__init__()
        c = lambda n: max(8, int(n * width))
        self.input_tnet = TNet(3, width) if input_transform else None
        self.embed = shared_mlp([3, c(64), c(64)])
        self.feature_tnet = TNet(c(64), width) if feature_transform else None
        self.features = shared_mlp([c(64), c(64), c(128), c(1024)])
        self.classifier = head([c(1024), c(512), c(256)], num_classes, dropout)

    def forward(self, points: torch.Tensor):
        x = points
        if self.input_tnet is not None:
            x = torch.bmm(x, self.input_tnet(x))
        x = self.embed(x)
        regulariser = None
        if self.feature_tnet is not None:
            transform = self.feature_tnet(x)
            x = torch.bmm(x, transform)
            if self.training:
                regulariser = orthogonality(transform)
        logits = self.classifier(max_pool(self.features(x)))
        if not self.training:
            return logits
        return logits, REGULARISER_WEIGHT * regulariser if regulariser is not None \
            else logits.new_zeros(())


def orthogonality(transform: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ||I - A A^T||_F^2: zero for a rotation, which keeps the features'
    geometry."""
    k = transform.shape[-1]
    product = torch.bmm(transform, transform.transpose(1, 2)).float()
    eye = torch.eye(k, device=transform.device)
    return (product - eye).pow(2).sum(dim=(1, 2)).mean()


def pointnet(num_classes: int = 40, **kwargs) -> PointNet:
    return PointNet(num_classes, **kwargs)


def pointnet_small(num_classes: int = 40, **kwargs) -> PointNet:
    return PointNet(num_classes, **{"width": 0.25, **kwargs})
