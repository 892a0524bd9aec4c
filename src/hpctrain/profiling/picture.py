"""The profile as a picture: the step split as one bar, and one step's timeline below it.

One layout (a list of rectangles and texts in pixels) is drawn twice: as SVG inside a
self-contained HTML page (no script, no font or file from the internet, hover titles on every
rectangle) and as a PNG drawn with Pillow, which hpctrain already needs, so no plotting
library is added for two pictures.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from hpctrain import writers
from hpctrain.profiling.analysis import Evidence
from hpctrain.profiling.verdict import Verdict

WIDTH, LEFT, RIGHT = 1100, 150, 20
COLOURS = {"data_wait": "#e4572e", "h2d_copy": "#f3a712", "forward": "#29335c",
           "backward": "#4f6d7a", "optimizer": "#a8c686", "other": "#c9c9c9",
           "sync": "#d7263d", "GPU matrix": "#1b998b", "GPU other compute": "#8fd1c7",
           "communication": "#7b2cbf", "memory copies": "#f4d35e"}


@dataclass
class Shape:
    x: float
    y: float
    w: float
    h: float
    colour: str = "#000000"
    text: str = ""  # a label (for text shapes) or a hover title (for rectangles)
    is_text: bool = False


def layout(evidence: Evidence, verdict: Verdict, title: str) -> tuple[list[Shape], int]:
    """Shapes and the picture's height."""
    plot = WIDTH - LEFT - RIGHT
    shapes = [Shape(10, 8, 0, 16, text=title, is_text=True),
              Shape(10, 30, 0, 14, "#d7263d", f"{verdict.bound}: {verdict.reason}"[:150],
                    is_text=True),
              Shape(10, 62, 0, 12, text="step split (mean)", is_text=True)]
    x = LEFT
    for name, stats in evidence.regions.items():
        width = stats["share"] * plot
        shapes.append(Shape(x, 58, width, 22, COLOURS.get(name, "#999999"),
                            f"{name}: {stats['mean_ms']:.2f} ms ({stats['share']:.0%})"))
        if width > 60:
            shapes.append(Shape(x + 4, 63, 0, 11, "#ffffff",
                                f"{name} {stats['share']:.0%}", is_text=True))
        x += width
    timeline = evidence.timeline
    step_ms = timeline.get("step_ms") or 1.0
    y = 104
    shapes.append(Shape(10, y, 0, 12, text=f"one step ({step_ms:.1f} ms), median of "
                        f"{evidence.steps}", is_text=True))
    y += 20
    for lane, spans in timeline.get("lanes", {}).items():
        shapes.append(Shape(10, y + 3, 0, 11, text=lane, is_text=True))
        shapes.append(Shape(LEFT, y + 8, plot, 1, "#dddddd"))
        for start, duration, label in spans:
            shapes.append(Shape(LEFT + start / step_ms * plot, y,
                                max(duration / step_ms * plot, 0.5), 16,
                                COLOURS.get(label, COLOURS.get(lane, "#999999")),
                                f"{label}: {duration:.3f} ms at +{start:.3f} ms"))
        y += 24
    for tick in range(5):
        shapes.append(Shape(LEFT + tick / 4 * plot - 10, y + 2, 0, 10, "#555555",
                            f"{step_ms * tick / 4:.1f} ms", is_text=True))
    y += 22
    used = [name for name in COLOURS if name in evidence.regions
            or any(span[2] == name for spans in timeline.get("lanes", {}).values()
                   for span in spans[:1])]
    for i, name in enumerate(used):  # the legend
        x = 10 + (i % 6) * 180
        row = y + (i // 6) * 18
        shapes += [Shape(x, row, 12, 12, COLOURS[name], name),
                   Shape(x + 16, row, 0, 11, "#333333", name, is_text=True)]
    return shapes, y + 18 * ((len(used) + 5) // 6) + 8


def _svg(shapes: list[Shape], height: int) -> str:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'font-family="sans-serif">']
    for s in shapes:
        if s.is_text:
            parts.append(f'<text x="{s.x:.1f}" y="{s.y + s.h:.1f}" font-size="{s.h:.0f}" '
                         f'fill="{s.colour}">{html.escape(s.text)}</text>')
        else:
            parts.append(f'<rect x="{s.x:.2f}" y="{s.y:.1f}" width="{s.w:.2f}" '
                         f'height="{s.h:.1f}" fill="{s.colour}"><title>'
                         f'{html.escape(s.text)}</title></rect>')
    parts.append("</svg>")
    return "\n".join(parts)


def write_html(path: Path, evidence: Evidence, verdict: Verdict, title: str,
               report_text: str) -> None:
    shapes, height = layout(evidence, verdict, title)
    page = (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>"
            f"{html.escape(title)}</title></head>\n<body style='font-family:sans-serif'>\n"
            f"{_svg(shapes, height)}\n<pre>{html.escape(report_text)}</pre>\n</body></html>\n")
    writers.write_whole(path, page)


def write_png(path: Path, evidence: Evidence, verdict: Verdict, title: str) -> None:
    shapes, height = layout(evidence, verdict, title)
    image = Image.new("RGB", (WIDTH, height), "white")
    draw = ImageDraw.Draw(image)
    fonts: dict[int, ImageFont.ImageFont] = {}
    for s in shapes:
        if s.is_text:
            size = int(s.h)
            if size not in fonts:
                fonts[size] = ImageFont.load_default(size=size)
            draw.text((s.x, s.y), s.text, fill=s.colour, font=fonts[size])
        else:
            draw.rectangle(pixel_box(s), fill=s.colour)
    writers.write_png(path, image)


def pixel_box(s: Shape) -> list[float]:
    """Pillow's corners of a rectangle, at least a pixel wide and high even as floats round
    (x + 1 - 1 can fall below x, which Pillow refuses: an fp8 profile on an H200 did)."""
    return [s.x, s.y, max(s.x, s.x + s.w - 1), max(s.y, s.y + s.h - 1)]
