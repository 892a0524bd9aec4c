"""What a run tells: a progress line or bar, metrics.jsonl, its trackers (TensorBoard, MLflow,
W&B: report/trackers.py), summary.json.

Only figures already read back from the device reach this module (at logging intervals), so
nothing here forces a host-device synchronisation inside the training step. Only rank 0
reports; on the other ranks a Telemetry is built disabled and says nothing.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hpctrain.errors import OutputError, cannot_write
from hpctrain.readers import Unreadable, capped_lines, open_capped, parse_json
from hpctrain.runs.directory import CAPS, METRICS, RECORD_CAP, RunDir, mark_changed
from hpctrain.units import fmt_bytes
from hpctrain.writers import open_appending, truncate, write_whole

KEEP_GOING = "Free space (or set output_dir elsewhere) and run again with resume=auto"
CLOSE_SECONDS = 10.0  # for each tracker to close at the run's end


class Telemetry:
    def __init__(self, run_dir: Path, total_steps: int, start_step: int, enabled: bool = True,
                 saved_bytes: int | None = None, trained_to: int | None = None):
        """`start_step`, `saved_bytes`: the checkpoint this start resumes from (0: none), and
        metrics.jsonl's size when it was saved (None: not recorded); `trained_to`: the steps
        a job before that died without a word had trained, by its last beat (None: not
        known)."""
        self.enabled = enabled
        self.sinks = []
        self.progress = None
        self.redone_steps = 0  # steps a job before this one trained after the checkpoint
        self.redone_seconds: float | None = None  # what they took it, from its records
        self.forgotten_until: float | None = None  # the time of the last record forgotten
        if not enabled:
            return
        self.metrics = RunDir(run_dir).metrics
        try:
            run_dir.mkdir(parents=True, exist_ok=True)  # the run exists once it reports
            self.redone_steps, self.redone_seconds, self.forgotten_until = \
                forget_lost_records(self.metrics, start_step, saved_bytes, trained_to)
            self.metrics_file = open_appending(self.metrics)
        except OSError as err:
            raise cannot_write(self.metrics, err, KEEP_GOING) from None
        except Unreadable as err:
            raise OutputError(f"{self.metrics} {err}: it is no metrics file of a run; move it "
                              "away and run again with resume=auto") from None
        self.total_steps = total_steps
        if sys.stdout.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                TextColumn("ETA"), TimeRemainingColumn(), transient=False)
            self.task = self.progress.add_task("train", total=total_steps,
                                               completed=start_step, status="")
            self.progress.start()

    def record(self, kind: str, step: int, values: dict) -> None:
        """Append one metrics.jsonl record, and hand it to every tracker."""
        if not self.enabled:
            return
        row = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        try:
            self.metrics_file.write(json.dumps(row) + "\n")
        except OSError as err:
            raise cannot_write(self.metrics, err, KEEP_GOING) from None
        self._to_sinks("record", kind, step, row["time"], values)

    def add_sinks(self, sinks: list) -> None:
        """The trackers (opened once run.json exists: it holds their run ids)."""
        self.sinks = sinks

    def _to_sinks(self, call: str, *args, only=None) -> None:
        """A tracker that fails (a server gone, a full disk) is said once and dropped: it is
        never a reason to stop training, and metrics.jsonl keeps everything. `only`: that
        tracker alone."""
        for sink in list(self.sinks) if only is None else [only]:
            try:
                getattr(sink, call)(*args)
            except Exception as err:
                if sink in self.sinks:
                    self.sinks.remove(sink)
                print(f"hpctrain: warning: {type(sink).__name__.lower()} stopped receiving "
                      f"this run's figures ({type(err).__name__}: {str(err)[:300]}); "
                      "metrics.jsonl has them all", file=sys.stderr, flush=True)

    def finish(self, summary: dict, files: list[Path]) -> None:
        """The trackers get the summary (final metrics) and `files` (artifacts), and close,
        each within CLOSE_SECONDS: a writer that does not (TensorBoard's waited two minutes
        after a Ctrl-C; a tracking server gone) is said and left behind, on a daemon thread
        that the process's end takes with it."""
        if not self.enabled:
            return
        for sink in list(self.sinks):
            closing = threading.Thread(target=self._to_sinks, args=("finish", summary, files),
                                       kwargs={"only": sink}, daemon=True,
                                       name="hpctrain-tracker-close")
            closing.start()
            closing.join(CLOSE_SECONDS)
            if closing.is_alive():
                print(f"hpctrain: warning: {type(sink).__name__.lower()} did not close within "
                      f"{CLOSE_SECONDS:.0f} s; its last figures may be missing there, "
                      "metrics.jsonl has them all", file=sys.stderr, flush=True)
        self.sinks = []

    def show(self, step: int, line: str) -> None:
        if not self.enabled:
            return
        if self.progress:
            self.progress.update(self.task, completed=step, status=line)
        else:
            print(f"step {step}/{self.total_steps}  {line}", flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.progress:
            self.progress.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.progress:
            self.progress.stop()
        try:
            self.metrics_file.close()
        except OSError:  # the record that failed was reported when it was written
            pass


def forget_lost_records(metrics: Path, step: int, saved_bytes: int | None,
                        trained_to: int | None = None) -> tuple[int, float | None,
                                                                float | None]:
    """At a start, forget what was logged after the checkpoint it resumes from: those steps
    and evaluations run again, and metrics.jsonl then tells each once. Where the checkpoint
    recorded the file's size, the file is cut back to it, which is exact: also an evaluation
    done after the checkpoint, which it owed, goes (a kill during the save after it would
    otherwise leave it twice). A start without a checkpoint keeps nothing: what is there was
    logged by a job killed before its first save. A checkpoint of an older hpctrain: every
    record after its step is dropped. Returns the steps trained after the checkpoint that
    are done again, to the last one the job before trained (`trained_to`, its last beat's),
    else to the last one a training record forgotten tells, and the seconds they took: that
    many steps at the median `seconds_per_step` of the records forgotten, else of the last
    ones kept (the median: an interval that held a save or a slow first step does not
    stretch them; None: no record tells); and the time of the last record forgotten (the
    job before was alive then: its heartbeat may be a second older; None: none)."""
    size = 0 if step == 0 else saved_bytes
    if size is not None and _line_ends_at(metrics, size):
        forgotten = _lines_from(metrics, size)
        truncate(metrics, size)
    elif step:
        forgotten = drop_records_after(metrics, step)
    else:
        forgotten = []
    records = [record for record in map(_record, forgotten) if record is not None]
    trained = [(done, each) for done, each in filter(None, map(_train_record, records))
               if done > step]
    redone = max(trained[-1][0] - step if trained else 0, (trained_to or step) - step)
    times = [each for _, each in trained] or _kept_step_times(metrics)
    until = max(filter(None, map(_record_time, records)), default=None)
    if not redone:
        return 0, 0.0, until
    if not times or None in times:
        return redone, None, until
    return redone, redone * statistics.median(times), until


KEPT_TAIL = 64 * 1024  # bytes of metrics.jsonl's end read for the step times kept


def _kept_step_times(metrics: Path) -> list[float]:
    """The `seconds_per_step` of the last training records kept (at most 16), read from
    the file's end."""
    try:
        with os.fdopen(os.open(metrics, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") \
                as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - KEPT_TAIL))
            lines = handle.read(KEPT_TAIL).decode(errors="replace").splitlines()[1:]
    except OSError:
        return []
    times = [each for _, each in filter(None, map(_train_record, map(_record, lines)))]
    return [each for each in times if each is not None][-16:]


def _lines_from(metrics: Path, offset: int) -> list[str]:
    """The lines of metrics.jsonl after its first `offset` bytes (what a cut takes away)."""
    with open_capped(metrics, CAPS[METRICS]) as handle:
        handle.seek(offset)
        return handle.read(CAPS[METRICS]).decode(errors="replace").splitlines()


def _record(line: str) -> dict | None:
    """A metrics.jsonl line's record; None where the line holds none (cut, or damaged)."""
    try:
        record = parse_json(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _train_record(record: dict | None) -> tuple[int, float | None] | None:
    """(step, seconds_per_step) of a training record; None for another record, or none."""
    if record is None or record.get("kind") != "train":
        return None
    step, seconds = record.get("step"), record.get("seconds_per_step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    return step, (float(seconds) if isinstance(seconds, (int, float)) and not isinstance(
        seconds, bool) and math.isfinite(seconds) and seconds >= 0 else None)


def _record_time(record: dict) -> float | None:
    """A record's `time` (epoch seconds); None where it holds none."""
    moment = record.get("time")
    return float(moment) if isinstance(moment, (int, float)) and not isinstance(
        moment, bool) and math.isfinite(moment) else None


def _line_ends_at(metrics: Path, size: int) -> bool:
    """Whether the file is at least `size` bytes and a line ends there (the file the size
    was taken of, not a replaced or shortened one)."""
    try:
        with open_capped(metrics, CAPS[METRICS]) as file:
            if file.seek(0, 2) < size:
                return False
            if size == 0:
                return True
            file.seek(size - 1)
            return file.read(1) == b"\n"
    except (OSError, Unreadable):
        return False


def drop_records_after(metrics: Path, step: int) -> list[str]:
    """On resume, forget what was logged after the checkpoint: those steps run again, and
    metrics.jsonl then tells each step once. Returns the lines taken out."""
    if not metrics.is_file():
        return []
    kept, dropped = [], []
    for line in capped_lines(metrics, CAPS[METRICS], RECORD_CAP):
        if line is not None:  # a line over the cap is no record: dropped, not kept
            line = line.decode(errors="replace")
            (dropped if record_step(line) > step else kept).append(line)
    if dropped:
        write_whole(metrics, "".join(kept))
    return dropped


def record_step(line: str) -> float:
    """A metrics record's step; a line cut short by a crash (or not a record) counts as after
    every step."""
    try:
        step = parse_json(line).get("step", 0)
    except (ValueError, AttributeError):
        return math.inf
    return step if isinstance(step, (int, float)) else math.inf


def write_summary(run_dir: Path, summary: dict) -> str | None:
    """Replace summary.json at once (through a fresh temporary file); on a failed write (a
    full disk) the temporary file is removed, the old summary.json stays, and the problem is said
    and returned."""
    path = RunDir(run_dir).summary
    try:
        write_whole(path, json.dumps(summary, indent=2) + "\n")
        mark_changed(run_dir)  # for the runs index
    except OSError as err:
        problem = str(cannot_write(path, err, KEEP_GOING))
        print(f"hpctrain: warning: {problem}", file=sys.stderr, flush=True)
        return problem
    return None


SUMMARY_ROWS = [
    ("status", "{}"), ("stopped_early", "{}"), ("task", "{}"), ("best_val_accuracy", "{:.4f}"),
    ("final_val_accuracy", "{:.4f}"), ("best_val_loss", "{:.4f}"), ("final_val_mse", "{:.4g}"),
    ("final_val_mae", "{:.4g}"), ("final_val_r2", "{:.4f}"), ("final_val_f1", "{:.4f}"),
    ("final_val_exact_match", "{:.4f}"), ("final_val_miou", "{:.4f}"),
    ("best_val_perplexity", "{:.3f}"), ("images_per_second", "{:,.1f}"),
    ("tokens_per_second", "{:,.0f}"), ("samples_per_second", "{:,.1f}"),
    ("padding_fraction", "{:.1%}"), ("mfu", "{:.1%}"), ("data_wait_fraction", "{:.1%}"),
    ("peak_memory_bytes", "bytes"), ("wall_seconds", "{:,.1f}"), ("steps", "{}"),
    ("epochs", "{:.2f}"), ("global_batch_size", "{}"), ("effective_lr", "{:.4g}"),
    ("device", "{}"), ("world_size", "{}"), ("strategy", "{}"), ("precision", "{}"),
    ("device_hours", "{:.4f}"), ("goodput", "{:.1%}"), ("gpu_utilization_mean", "{:.0%}"),
    ("gpu_power_mean_watts", "{:,.0f} W"), ("energy_kwh", "{:.4f} kWh"),
    ("samples_per_joule", "{:,.2f}"), ("energy_source", "{}"), ("restarts", "{}"),
    ("skipped_images", "{}"),
]


IMAGE_ROWS = ("images_per_second", "skipped_images")  # shown for a task on images


def print_summary(summary: dict, run_dir: Path) -> None:
    table = Table(title=f"hpctrain run: {run_dir}", show_header=False)
    images = summary.get("images_per_second") is not None  # else not a task on images
    for key, fmt in SUMMARY_ROWS:
        if key not in summary or (key in IMAGE_ROWS and not images):  # another task's figure
            continue
        value = summary.get(key)
        if value is None:
            text = "-"
        elif fmt == "bytes":
            text = fmt_bytes(value)
        else:
            text = fmt.format(value)
        table.add_row(key, text)
    slow = summary.get("straggler")
    if slow:
        table.add_row("straggler", f"rank {slow['rank']} on {slow['host']}: "
                      f"{slow['step_seconds'] * 1e3:,.1f} ms/step, "
                      f"{slow['ratio_to_median']:.2f}x the median rank")
    Console(width=100).print(table)
