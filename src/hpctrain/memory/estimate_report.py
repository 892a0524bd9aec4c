"""The memory estimate for people (a table and the advice), for machines (JSON) and as a
picture (PNG, drawn with Pillow like the profile's): the predicted peak as one stacked bar per
category against the device's capacity, and one bar per option of the advice."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from hpctrain.memory.advice import Advice
from hpctrain.memory.estimate import Estimate
from hpctrain.units import fmt_bytes
from hpctrain.writers import write_png

COLOURS = {"parameters": "#29335c", "gradients": "#4f6d7a", "optimizer states": "#a8c686",
           "gradient buckets": "#6b8f71", "gathered parameters": "#7b2cbf",
           "gradient reduce buffers": "#b185db", "weight copies": "#f3a712",
           "activations": "#e4572e", "temporaries": "#f4d35e", "inputs": "#c9c9c9",
           "allocator overhead": "#bbbbbb", "CUDA context": "#888888"}


def shown_rows(est: Estimate) -> list[tuple[str, int]]:
    rows = [(k, v) for k, v in est.rows.items() if v]
    if est.target.overhead:
        rows.append(("allocator overhead", int(est.peak * est.target.overhead)))
    if est.target.context:
        rows.append(("CUDA context", est.target.context))
    return rows


def text_report(est: Estimate, advice: Advice, measured: dict | None = None,
                counterpart: Estimate | None = None) -> str:
    t, split = est.target, est.target.layout
    layout = "one device" if split.world_size == 1 else \
        f"{split.strategy} over {split.world_size} devices"
    if split.model_parallel:
        layout = f"{split.world_size} devices: " + " ".join(t.layout_settings()) + \
            (f", data {split.data} ({split.strategy})" if split.data > 1 else "")
    lines = [f"memory of {est.recipe}: {est.model}, batch {est.batch_size} per device, input "
             f"{'x'.join(map(str, est.input_shape))}, {t.precision}"
             + (", activation checkpointing" if est.activation_checkpointing else ""),
             f"  {t.device}, {layout}; capacity {fmt_bytes(t.capacity)} ({t.capacity_source})",
             f"  {est.info.parameters:,} parameters; {est.method}", ""]
    for name, value in shown_rows(est):
        if name == "allocator overhead":
            lines.append(f"  {'= peak allocated':<26}{fmt_bytes(est.peak):>12}")
        lines.append(f"  {name:<26}{fmt_bytes(value):>12}  {value / est.in_use:6.1%}")
    lines.append(f"  {'= in use at the peak':<26}{fmt_bytes(est.in_use):>12}  "
                 f"{est.in_use / t.capacity:6.1%} of the device")
    if counterpart is not None:
        state = "with" if counterpart.activation_checkpointing else "without"
        lines.append(f"  {state} activation checkpointing: activations "
                     f"{fmt_bytes(counterpart.rows['activations'])}, in use "
                     f"{fmt_bytes(counterpart.in_use)}")
    for note in est.notes + est.footprint.notes:
        lines.append(f"  note: {note}")
    if measured:
        lines += ["", f"measured ({measured['what']}): {fmt_bytes(measured['measured_bytes'])}"
                  f" against {fmt_bytes(measured['predicted_bytes'])} predicted, error "
                  f"{measured['relative_error']:+.1%}"]
        if "measured_peak_bytes" in measured:
            lines.append(f"  the step's peak: {fmt_bytes(measured['measured_peak_bytes'])} "
                         f"against {fmt_bytes(measured['predicted_peak_bytes'])} predicted, "
                         f"error {measured['peak_relative_error']:+.1%}"
                         + (f" ({measured['why']})" if measured.get("why") else ""))
    lines += ["", advice.summary]
    for i, option in enumerate(advice.options, 1):
        mark = "fits" if option.fits else "does not fit"
        lines.append(f"  {i}. {' '.join(option.settings)}: {fmt_bytes(option.in_use)} "
                     f"({mark}); {option.effect}")
    return "\n".join(lines)


def document(est: Estimate, advice: Advice, measured: dict | None = None,
             counterpart: Estimate | None = None) -> dict:
    return {"estimate": est.to_json(), "advice": advice.to_json(), "measured": measured,
            "checkpointing_counterpart": counterpart.to_json() if counterpart else None}


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def write_picture(est: Estimate, advice: Advice, path: Path) -> Path:
    """Stacked bar of the peak, a bar per option, the capacity as a red line."""
    width, left, right, bar = 1000, 260, 90, 26
    bars = [("predicted", shown_rows(est))]
    bars += [(" ".join(o.settings)[:40], [("option", o.in_use)]) for o in advice.options]
    height = 70 + len(bars) * (bar + 14) + 80
    top = max([est.target.capacity, est.in_use] + [o.in_use for o in advice.options])
    scale = (width - left - right) / top
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((10, 10), f"{est.recipe}: {est.model}, batch {est.batch_size}, "
              f"{est.target.precision}", fill="black", font=_font(16))
    draw.text((10, 34), advice.summary[:140], fill="#d7263d", font=_font(12))
    y = 70
    for label, parts in bars:
        draw.text((10, y + 6), label, fill="black", font=_font(12))
        x = left
        for name, value in parts:
            w = value * scale
            draw.rectangle([x, y, x + max(w, 1), y + bar], fill=COLOURS.get(name, "#1b998b"))
            x += w
        draw.text((x + 4, y + 6), fmt_bytes(sum(v for _, v in parts)), fill="black",
                  font=_font(12))
        y += bar + 14
    cap_x = left + est.target.capacity * scale
    draw.line([cap_x, 62, cap_x, y], fill="#d7263d", width=2)
    label = f"capacity {fmt_bytes(est.target.capacity)}"
    draw.text((cap_x - 7 * len(label), y + 2), label, fill="#d7263d", font=_font(12))
    y += 24
    x = 10
    for name, _ in bars[0][1]:
        draw.rectangle([x, y, x + 12, y + 12], fill=COLOURS.get(name, "#1b998b"))
        draw.text((x + 16, y), name, fill="black", font=_font(11))
        x += 24 + 7 * len(name)
        if x > width - 150:
            x, y = 10, y + 18
    path.parent.mkdir(parents=True, exist_ok=True)
    write_png(path, image)
    return path
