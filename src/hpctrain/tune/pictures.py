"""A search's two pictures, drawn with Pillow as the run report's are (no plotting library):
the optimisation history (each completed trial's value and the best so far) and parallel
coordinates (one polyline per completed trial across its parameters, coloured by its value).
"""

from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from hpctrain.report import chart
from hpctrain.writers import write_png

WIDTH, HEIGHT, MARGIN, TOP = 760, 370, 70, 60


def _completed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["state"] == "complete" and r["value"] is not None]


def history_picture(rows: list[dict], search, path: Path) -> bool:
    done = _completed(rows)
    if not done:
        return False
    better = max if search.direction == "maximize" else min
    best, points = None, []
    for row in done:
        best = row["value"] if best is None else better(best, row["value"])
        points.append((row["trial"], best, f"trial {row['trial']}: best so far {best:.4g}"))
    values = [(r["trial"], r["value"], f"trial {r['trial']}: {r['value']:.4g}") for r in done]
    chart.png(chart.Chart(f"{search.objective} by trial", "trial", [
        chart.Line("trial", chart.PALETTE[0], values),
        chart.Line("best so far", chart.PALETTE[1], points)]), path)
    return True


def _position(parameter, value) -> float:
    """Where `value` sits on its parameter's axis, 0 (bottom) to 1."""
    if parameter.kind == "choice":
        return parameter.choices.index(value) / max(1, len(parameter.choices) - 1)
    low, high = parameter.low, parameter.high
    if parameter.kind in ("loguniform", "logint"):
        return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
    return (value - low) / (high - low)


def _ends(parameter) -> tuple[str, str]:
    if parameter.kind == "choice":
        return str(parameter.choices[0]), str(parameter.choices[-1])
    return f"{parameter.low:g}", f"{parameter.high:g}"


def _colour(share: float) -> tuple[int, int, int]:
    """Worst (0) light blue to best (1) dark red."""
    return (int(120 + 95 * share), int(170 - 140 * share), int(220 - 180 * share))


def parallel_picture(rows: list[dict], search, parameters: list, path: Path) -> bool:
    done = _completed(rows)
    if not done:
        return False
    values = [r["value"] for r in done]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    axes = [search.objective, *(p.key for p in parameters)]
    step = (WIDTH - 2 * MARGIN) / max(1, len(axes) - 1)
    xs = [MARGIN + i * step for i in range(len(axes))]
    bottom = HEIGHT - 40
    draw.text((10, 8), f"parallel coordinates: {len(done)} completed trials, colour by "
              f"{search.objective} (red: best)", fill="black", font=font)

    def y(share: float) -> float:
        return bottom - share * (bottom - TOP)

    for row in sorted(done, key=lambda r: r["value"] * (1 if search.direction == "maximize"
                                                        else -1)):
        share = (row["value"] - low) / span
        best_share = share if search.direction == "maximize" else 1 - share
        line = [(xs[0], y(share))] + [
            (x, y(_position(p, row["params"][p.key]))) for x, p in zip(xs[1:], parameters)
            if p.key in row["params"]]
        draw.line(line, fill=_colour(best_share), width=2)
    ends = [(f"{low:.4g}", f"{high:.4g}"), *(_ends(p) for p in parameters)]
    for x, name, (lowest, highest) in zip(xs, axes, ends):
        draw.line((x, TOP, x, bottom), fill="#444444", width=1)
        for text, at in ((name, TOP - 28), (highest, TOP - 14), (lowest, bottom + 4)):
            width = draw.textlength(text, font=font)
            draw.text((x - width / 2, at), text, fill="black", font=font)
    write_png(path, image)
    return True
