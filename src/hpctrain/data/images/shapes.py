"""The built-in `shapes` dataset: rendered shapes on textured, noisy backgrounds.

A newcomer needs a real image-classification task that downloads nothing (compute nodes
have no internet), exercises the whole JPEG -> decode -> augment pipeline, and trains to high
accuracy on a laptop in minutes. Nothing installable provides that, so we render it:
ten classes of shapes with random colour, position, scale and rotation, on a gradient plus
low-frequency texture background, with pixel noise, saved as JPEG files in ImageFolder layout.
Every image is a pure function of (seed, split, index), so the set is identical everywhere.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from hpctrain.data.generated import generate_once
from hpctrain.progress_bar import progress_bar

CLASSES = (
    "circle", "ring", "square", "frame", "triangle",
    "star", "cross", "crescent", "arrow", "bars",
)
SUPERSAMPLE = 3  # render larger, then downsample: anti-aliased edges
FORMAT_VERSION = 1
PARALLEL_FROM = 2000  # below this, starting worker processes costs more than it saves


def _polygon(points: np.ndarray, cx: float, cy: float, r: float, angle: float) -> list[tuple]:
    """Scale unit-size `points` by r, rotate by angle and move to (cx, cy)."""
    c, s = math.cos(angle), math.sin(angle)
    rot = points @ np.array([[c, s], [-s, c]]) * r
    return [(cx + x, cy + y) for x, y in rot]


def _star(n_points: int = 5, inner: float = 0.45) -> np.ndarray:
    a = np.arange(2 * n_points) * math.pi / n_points - math.pi / 2
    rad = np.where(np.arange(2 * n_points) % 2 == 0, 1.0, inner)
    return np.stack([rad * np.cos(a), rad * np.sin(a)], axis=1)


_UNIT = {
    "square": np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]]) * 0.75,
    "triangle": np.array([[0, -1], [0.87, 0.5], [-0.87, 0.5]]),
    "star": _star(),
    "cross": np.array([[-0.3, -1], [0.3, -1], [0.3, -0.3], [1, -0.3], [1, 0.3], [0.3, 0.3],
                       [0.3, 1], [-0.3, 1], [-0.3, 0.3], [-1, 0.3], [-1, -0.3], [-0.3, -0.3]]),
    "arrow": np.array([[-1, -0.25], [0.1, -0.25], [0.1, -0.7], [1, 0], [0.1, 0.7],
                       [0.1, 0.25], [-1, 0.25]]),
}


def _draw_shape(draw: ImageDraw.ImageDraw, name: str, cx, cy, r, angle) -> None:
    """Draw one shape into a mask: 255 inside, 0 in the hollow parts."""
    fill, bg = 255, 0
    if name == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif name == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        draw.ellipse([cx - r * 0.55, cy - r * 0.55, cx + r * 0.55, cy + r * 0.55], fill=bg)
    elif name == "frame":
        draw.polygon(_polygon(_UNIT["square"], cx, cy, r * 1.15, angle), fill=fill)
        draw.polygon(_polygon(_UNIT["square"], cx, cy, r * 0.65, angle), fill=bg)
    elif name == "crescent":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        ox, oy = 0.45 * r * math.cos(angle), 0.45 * r * math.sin(angle)
        draw.ellipse([cx + ox - r * 0.85, cy + oy - r * 0.85,
                      cx + ox + r * 0.85, cy + oy + r * 0.85], fill=bg)
    elif name == "bars":
        bar = np.array([[-1, -0.16], [1, -0.16], [1, 0.16], [-1, 0.16]])
        for offset in (-0.6, 0.0, 0.6):
            dx, dy = -offset * r * math.sin(angle), offset * r * math.cos(angle)
            draw.polygon(_polygon(bar, cx + dx, cy + dy, r, angle), fill=fill)
    else:
        draw.polygon(_polygon(_UNIT[name], cx, cy, r, angle), fill=fill)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A linear colour gradient plus smooth random texture, float32 HxWx3 in 0-255."""
    c1, c2 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    theta = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:size, 0:size] / size
    t = (xx * math.cos(theta) + yy * math.sin(theta) + 1) / 2
    img = c1 + (c2 - c1) * t[..., None]
    coarse = Image.fromarray(rng.uniform(0, 255, (4, 4, 3)).astype(np.uint8))
    texture = np.asarray(coarse.resize((size, size), Image.BICUBIC), dtype=np.float32)
    return img * 0.75 + texture * rng.uniform(0.1, 0.35) - 20


def render(seed: int, split: str, index: int, size: int) -> tuple[Image.Image, int]:
    """Render sample `index` of `split`; the label cycles through the classes."""
    label = index % len(CLASSES)
    split_key = {"train": 0, "val": 1}[split]
    rng = np.random.default_rng([seed, split_key, index])
    big = size * SUPERSAMPLE
    bg = np.clip(_background(rng, big), 0, 255)
    while True:  # a shape colour that stands out from the background
        fill = rng.uniform(0, 255, 3)
        if np.abs(fill - bg.mean(axis=(0, 1))).sum() > 150:
            break
    r = rng.uniform(0.22, 0.40) * big
    cx, cy = rng.uniform(r * 0.8, big - r * 0.8, 2)
    angle = rng.uniform(0, 2 * math.pi)
    mask = Image.new("L", (big, big), 0)
    _draw_shape(ImageDraw.Draw(mask), CLASSES[label], cx, cy, r, angle)
    alpha = np.asarray(mask.resize((size, size), Image.BOX), dtype=np.float32)[..., None] / 255
    bg_small = np.asarray(Image.fromarray(bg.astype(np.uint8)).resize((size, size), Image.BOX),
                          dtype=np.float32)
    small = bg_small * (1 - alpha) + fill * alpha
    noisy = small + rng.normal(0, rng.uniform(2, 14), small.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)), label


def _write_range(job: tuple) -> int:
    folder, seed, split, start, stop, size = job
    for i in range(start, stop):
        image, label = render(seed, split, i, size)
        image.save(folder / split / CLASSES[label] / f"{i:06d}.jpg", quality=90)
    return stop - start


def ensure_shapes(root: Path, seed: int, num_train: int, num_val: int, size: int) -> Path:
    """Generate the dataset under `root` once (generated.py) and return its folder, whose
    name encodes every parameter."""
    folder = Path(root) / f"shapes-v{FORMAT_VERSION}-s{seed}-n{num_train}-{num_val}-px{size}"

    def make(tmp: Path) -> dict:
        for split in ("train", "val"):
            for name in CLASSES:
                (tmp / split / name).mkdir(parents=True, exist_ok=True)
        jobs = [(tmp, seed, split, start, min(start + 500, n), size)
                for split, n in (("train", num_train), ("val", num_val))
                for start in range(0, n, 500)]
        with progress_bar("generating the shapes dataset",
                          total=num_train + num_val) as advance:
            if num_train + num_val < PARALLEL_FROM:
                for job in jobs:
                    advance(_write_range(job))
            else:
                with multiprocessing.get_context("spawn").Pool(os.cpu_count() or 1) as pool:
                    for done in pool.imap_unordered(_write_range, jobs):
                        advance(done)
        return {"classes": CLASSES, "seed": seed}

    return generate_once(folder, make)
