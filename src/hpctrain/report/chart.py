"""A line chart as one layout (lines, points, texts in pixels) drawn twice: as SVG inside the
report page (every point carries its tooltip text; the page's own script shows it) and as a
PNG drawn with Pillow, which hpctrain already needs: no plotting library for a few charts.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from hpctrain.writers import write_png

WIDTH, HEIGHT = 560, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 14, 26, 40
MAX_POINTS = 1500  # per curve; a longer curve is thinned evenly (its last point kept)
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22"]


@dataclass
class Line:
    label: str
    colour: str
    points: list[tuple[float, float, str]]  # x, y (data), tooltip
    dashed: bool = False


@dataclass
class Chart:
    title: str
    x_label: str
    lines: list[Line] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)  # vertical lines: x, label


def nice_ticks(low: float, high: float, count: int = 5, whole: bool = False) -> list[float]:
    """Round tick values covering [low, high]; whole numbers only where `whole` (steps)."""
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= step * m)
    if whole:
        step = max(1, round(step))
    first = math.ceil(low / step - 1e-9) * step
    return [first + i * step for i in range(count + 2) if first + i * step <= high + 1e-9 * step]


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-2:
        return f"{value:.1e}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def thin(points: list, limit: int = MAX_POINTS) -> list:
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


@dataclass
class Placed:
    """The chart in pixels: what both drawings draw."""

    polylines: list[tuple[str, bool, list[tuple[float, float]]]]  # colour, dashed, pixels
    points: list[tuple[float, float, str, str]]  # x, y, colour, tooltip
    texts: list[tuple[float, float, str, str]]  # x, y, text, anchor (start|middle|end)
    grid: list[tuple[float, float, float, float]]  # x1, y1, x2, y2
    marks: list[tuple[float, str]]  # x pixel, label
    legend: list[tuple[str, str]]  # colour, label (the PNG's; the page writes its own)


def _spans(xs: list[float], ys: list[float]) -> tuple[float, float, float, float]:
    """The axes' ranges: x from the first point to the last (from 0 where every point has
    one x: a run that logged once), y over the values (centred on a single value)."""
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0 = min(0.0, x0)
        x1 = x1 if x1 > x0 else x0 + 1
    y0, y1 = min(ys), max(ys)
    if y1 == y0:
        pad = abs(y0) / 10 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    return x0, x1, y0, y1


def place(chart: Chart) -> Placed:
    xs = [x for line in chart.lines for x, _, _ in line.points] + [x for x, _ in chart.marks]
    ys = [y for line in chart.lines for _, y, _ in line.points]
    x0, x1, y0, y1 = _spans(xs, ys)
    x_ticks = nice_ticks(x0, x1, whole=all(float(x).is_integer() for x in xs))
    y_ticks = nice_ticks(y0, y1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - (y - y0) / (y1 - y0) * plot_h

    placed = Placed([], [], [(LEFT, 16, chart.title, "start"),
                             (LEFT + plot_w / 2, HEIGHT - 6, chart.x_label, "middle")], [], [],
                    [(line.colour, line.label) for line in chart.lines])
    for tick in x_ticks:
        placed.grid.append((px(tick), TOP, px(tick), TOP + plot_h))
        placed.texts.append((px(tick), TOP + plot_h + 15, _label(tick), "middle"))
    for tick in y_ticks:
        placed.grid.append((LEFT, py(tick), LEFT + plot_w, py(tick)))
        placed.texts.append((LEFT - 6, py(tick) + 4, _label(tick), "end"))
    for line in chart.lines:
        kept = thin(line.points)
        placed.polylines.append((line.colour, line.dashed, [(px(x), py(y)) for x, y, _ in kept]))
        placed.points += [(px(x), py(y), line.colour, tip) for x, y, tip in kept]
    placed.marks = [(px(x), label) for x, label in chart.marks]
    return placed


def svg(chart: Chart, index: int) -> str:
    """The chart as an SVG element; its points are <circle>s with a data-tip."""
    p = place(chart)
    out = [f'<svg class="chart" id="chart-{index}" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" data-points="{len(p.points)}">',
           f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
           f'height="{HEIGHT - TOP - BOTTOM}" class="area"/>']
    out += [f'<line x1="{a:.1f}" y1="{b:.1f}" x2="{c:.1f}" y2="{d:.1f}" class="grid"/>'
            for a, b, c, d in p.grid]
    for x, label in p.marks:
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" '
                   f'class="restart"><title>{html.escape(label)}</title></line>')
    for colour, dashed, pixels in p.polylines:
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pixels)
        out.append(f'<polyline points="{coords}" stroke="{colour}" class="curve'
                   f'{" dashed" if dashed else ""}"/>')
    out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}" class="point" '
            f'data-tip="{html.escape(tip)}"/>' for x, y, colour, tip in p.points]
    out += [f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{html.escape(text)}</text>'
            for x, y, text, anchor in p.texts]
    out.append("</svg>")
    return "\n".join(out)


def png(chart: Chart, path: Path) -> None:
    """The same chart as a PNG (for papers and chat), written whole or not at all."""
    write_png(path, image(chart))


def image(chart: Chart) -> Image.Image:
    """The chart drawn with Pillow."""
    p = place(chart)
    canvas = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default()
    for a, b, c, d in p.grid:
        draw.line((a, b, c, d), fill="#e6e6e6")
    for x, _ in p.marks:
        draw.line((x, TOP, x, HEIGHT - BOTTOM), fill="#999999", width=1)
    for colour, dashed, pixels in p.polylines:
        if len(pixels) > 1:
            draw.line(pixels, fill=colour, width=2 if not dashed else 1)
    for x, y, colour, _ in p.points:
        draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=colour)
    right = WIDTH - RIGHT
    for colour, label in reversed(p.legend):  # along the top, from the right
        width = draw.textlength(label, font=font)
        draw.text((right - width, 6), label, fill="black", font=font)
        draw.rectangle((right - width - 14, 11, right - width - 4, 14), fill=colour)
        right -= width + 24
    for x, y, text, anchor in p.texts:
        width = draw.textlength(text, font=font)
        left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
        draw.text((left, y - 10), text, fill="black", font=font)
    return canvas
