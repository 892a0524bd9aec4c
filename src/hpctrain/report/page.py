"""The report page: one self-contained HTML file of one or many runs (no network: its style,
script and charts are inline), and PNGs of the main charts beside it.

For each panel (loss, accuracy, perplexity, learning rate, throughput, data wait, GPU
utilisation, power, memory) a chart against the step and one against wall time (a button
switches every chart), restarts marked; then the summary, the configuration (several runs:
the settings that differ), the software, the Slurm job chain and the profile's verdict.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from hpctrain.config import flatten
from hpctrain.report import chart
from hpctrain.report.series import PANELS, RunSeries
from hpctrain.units import fmt_bytes
from hpctrain.writers import write_whole

MAIN_PANELS = ("loss", "accuracy", "perplexity", "throughput (samples/s)")
SUMMARY_KEYS = ("status", "best_val_accuracy", "final_val_accuracy", "best_val_loss",
                "best_val_perplexity", "images_per_second", "tokens_per_second",
                "samples_per_second", "data_wait_fraction", "padding_fraction", "mfu",
                "wall_seconds", "steps", "epochs", "global_batch_size", "effective_lr",
                "device", "world_size", "strategy", "precision", "device_hours", "goodput",
                "gpu_utilization_mean", "gpu_power_mean_watts", "energy_kwh",
                "samples_per_joule", "energy_source", "restarts", "peak_memory_bytes")

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; border: 1px solid #ddd; padding: 4px; width: 570px; }
svg.chart text { font-size: 11px; fill: #333; }
svg.chart .area { fill: #fcfcfc; stroke: #bbb; }
svg.chart .grid { stroke: #eee; }
svg.chart .curve { fill: none; stroke-width: 1.6; }
svg.chart .dashed { stroke-dasharray: 5 3; }
svg.chart .restart { stroke: #888; stroke-dasharray: 2 3; stroke-width: 1.5; }
svg.chart .point:hover { r: 5; }
.legend span { margin-right: 14px; white-space: nowrap; }
.legend i { display: inline-block; width: 18px; height: 3px; vertical-align: middle;
            margin-right: 4px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ddd; padding: 3px 8px;
text-align: left; } th { background: #f4f4f4; }
pre { background: #f7f7f7; padding: 8px; overflow: auto; max-height: 420px; }
#tip { position: fixed; pointer-events: none; background: #222; color: #fff; padding: 3px 6px;
       border-radius: 3px; font-size: 12px; display: none; }
.by-time { display: none; } body.time .by-time { display: inline-block; }
body.time .by-step { display: none; }
"""

SCRIPT = """
const tip = document.getElementById('tip');
document.querySelectorAll('circle.point').forEach(function (point) {
  point.addEventListener('mouseenter', function (event) {
    tip.textContent = point.dataset.tip;
    tip.style.display = 'block';
    tip.style.left = (event.clientX + 12) + 'px';
    tip.style.top = (event.clientY + 12) + 'px';
  });
  point.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
});
document.getElementById('axis').addEventListener('click', function () {
  document.body.classList.toggle('time');
  this.textContent = document.body.classList.contains('time') ?
    'x axis: wall time (switch to step)' : 'x axis: step (switch to wall time)';
});
"""


def _charts(runs: list[RunSeries], panel: str, by_time: bool) -> chart.Chart | None:
    many = len(runs) > 1
    x_label = "wall time (s since the first record)" if by_time else "step"
    made = chart.Chart(panel, x_label)
    for r, run in enumerate(runs):
        for c, curve in enumerate(run.panels.get(panel, [])):
            colour = chart.PALETTE[(r if many else c) % len(chart.PALETTE)]
            label = f"{run.name}: {curve.label}" if many else curve.label
            made.lines.append(chart.Line(
                label, colour, dashed=curve.label.startswith("validation"),
                points=[(seconds if by_time else step, value,
                         f"{label} | step {step} | {seconds:,.0f} s | {value:.5g}")
                        for step, seconds, value in curve.points]))
        made.marks += [(seconds if by_time else step, f"{run.name}: restarted at step {step}")
                       for step, seconds in run.restarts]
    return made if made.lines else None


def _legend(made: chart.Chart) -> str:
    items = [f'<span><i style="background:{line.colour}"></i>{html.escape(line.label)}'
             f'{" (dashed)" if line.dashed else ""}</span>' for line in made.lines]
    if made.marks:
        items.append('<span><i style="background:#888"></i>restart (requeue or resume)'
                     '</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def _table(rows: list[list[str]], header: list[str] | None = None) -> str:
    head = ("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"
            if header else "")
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table>{head}{body}</table>"


def _cell(value, size: bool = False) -> str:
    """A figure as the report prints it; `size`: bytes, in the units the terminal uses."""
    if value is None:
        return "-"
    if size and isinstance(value, (int, float)):
        return fmt_bytes(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value) if not isinstance(value, (dict, list)) else json.dumps(value)


def _summary(runs: list[RunSeries]) -> str:
    keys = [k for k in SUMMARY_KEYS if any(k in run.summary for run in runs)]
    rows = [[key, *[_cell(run.summary.get(key), key.endswith("_bytes")) for run in runs]]
            for key in keys]
    rows.append(["Slurm jobs", *[" -> ".join(run.jobs) or "-" for run in runs]])
    return _table(rows, ["", *[run.name for run in runs]])


def _configuration(runs: list[RunSeries]) -> str:
    if len(runs) == 1:
        import yaml

        text = yaml.safe_dump(runs[0].config, sort_keys=False) if runs[0].config else \
            "(no config.yaml)"
        return f"<details open><summary>config.yaml</summary><pre>{html.escape(text)}</pre>" \
               "</details>"
    flat = [flatten(run.config) for run in runs]
    keys = sorted(set().union(*flat))
    differ = [[key, *[_cell(f.get(key)) for f in flat]] for key in keys
              if key not in ("run_name", "resume", "output_dir")
              and len({json.dumps(f.get(key), sort_keys=True) for f in flat}) > 1]
    if not differ:
        return "<p>The runs' configurations are the same.</p>"
    return "<p>Settings that differ:</p>" + _table(differ, ["", *[run.name for run in runs]])


def _software_and_verdicts(runs: list[RunSeries]) -> str:
    parts = []
    for run in runs:
        software = run.summary.get("software") or {}
        who = run.identity
        lines = [f"user {who.get('user', '-')}, cluster {who.get('cluster') or '-'}, "
                 f"commit {who.get('git_commit') or '-'}",
                 ", ".join(f"{k} {v}" for k, v in software.items() if k != "python") or "-"]
        lines += [f"damaged, left out: {damage}" for damage in run.damage]
        lines += [f"job {number} hung: {start['hung']}" for number, start in
                  enumerate(who.get("starts") or [], 1) if isinstance(start, dict) and
                  start.get("hung")]  # its stacks: RUN_DIR/hang/
        if run.memory:
            lines.append(_memory_line(run.memory, run.summary))
        if run.profile:
            lines.append(f"profile verdict: {run.profile['bound'].upper()}: "
                         f"{run.profile['reason']}")
            lines += [f"  {i}. {r.get('change', r) if isinstance(r, dict) else r}"
                      for i, r in enumerate(run.profile.get("recommendations") or [], 1)]
        parts.append(f"<h3>{html.escape(run.name)}</h3><pre>"
                     + html.escape("\n".join(lines)) + "</pre>")
    return "".join(parts)


def _memory_line(memory: dict, summary: dict) -> str:
    """The prediction (hpctrain memory) beside what the run measured."""
    line = (f"memory predicted (hpctrain memory, {memory['device']}, batch "
            f"{memory['batch_size']}, {memory['precision']}): peak allocated "
            f"{fmt_bytes(memory['peak_allocated_bytes'])}, in use "
            f"{fmt_bytes(memory['in_use_bytes'])}")
    measured = summary.get("peak_memory_bytes")
    if isinstance(measured, (int, float)):
        line += f"; measured peak {fmt_bytes(measured)} ({summary.get('peak_memory_kind')})"
    return line


def render(runs: list[RunSeries]) -> tuple[str, dict[str, chart.Chart]]:
    """The page, and the step charts of the main panels (for the PNGs)."""
    title = runs[0].name if len(runs) == 1 else f"{len(runs)} runs"
    figures, main, index = [], {}, 0
    for panel in PANELS:
        by_step, by_time = _charts(runs, panel, False), _charts(runs, panel, True)
        if by_step is None:
            continue
        figures.append(f'<figure data-panel="{html.escape(panel)}">'
                       f'<span class="by-step">{chart.svg(by_step, index)}</span>'
                       f'<span class="by-time">{chart.svg(by_time, index + 1)}</span>'
                       f"{_legend(by_step)}</figure>")
        index += 2
        if panel in MAIN_PANELS:
            main[panel] = by_step
    body = [f"<h1>hpctrain report: {html.escape(title)}</h1>",
            "<p>" + ", ".join(html.escape(str(run.path)) for run in runs) + "</p>",
            '<button id="axis">x axis: step (switch to wall time)</button>',
            '<div class="charts">' + "".join(figures) + "</div>"
            if figures else "<p>No curves: the runs recorded no metrics yet.</p>",
            "<h2>Summary</h2>", _summary(runs),
            "<h2>Configuration</h2>", _configuration(runs),
            "<h2>Software, code and profile</h2>", _software_and_verdicts(runs),
            '<div id="tip"></div>']
    page = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>hpctrain report: {html.escape(title)}</title><style>{STYLE}</style>"
            f"</head><body>{''.join(body)}<script>{SCRIPT}</script></body></html>\n")
    return page, main


def write(runs: list[RunSeries], out: Path) -> list[Path]:
    """The page at `out`, and report-<panel>.png beside it; each written whole or not at
    all. The files written."""
    page, main = render(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(out, page)
    written = [out]
    for panel, made in main.items():
        picture = out.with_name(f"{out.stem}-{re.sub(r'[^a-z]+', '-', panel).strip('-')}.png")
        chart.png(made, picture)
        written.append(picture)
    return written


def write_run_report(run_dir: Path) -> str | None:
    """A finished run's own report.html (and PNGs) in its directory; a report that cannot be
    written is said (returned), never a reason to fail the run that trained."""
    from hpctrain.report.series import read_run
    from hpctrain.runs.directory import RunDir

    try:
        write([read_run(run_dir)], RunDir(run_dir).report)
    except Exception as err:  # whatever it is: the run trained, and its summary stands
        return f"the run's report could not be written ({type(err).__name__}: {err}); make " \
               f"it later with hpctrain report {run_dir}"
    return None
