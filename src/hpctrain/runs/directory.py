"""The run directory's one owner: the names of its files, and reading what tools read of it.

    <output_dir>/<name>/config.yaml    the resolved configuration
                        run.json       who, where and which jobs (written at every start)
                        run.lock       the living run that holds the folder (runs/lock.py)
                        metrics.jsonl  one JSON object per logging interval and evaluation
                        summary.json   the end-of-run figures
                        checkpoints/   step_NNNNNNNN/ folders, each with meta.json
                        tb/  profile/  report.html  job.sbatch  job.json  (the jobs' logs,
                        named by their scheduler: cluster/scheduler.py's JOB_LOG)
                        wandb/         W&B's own folder (tracking.sinks=[wandb])
                        hang/          the latest hang: each rank's stacks and view, the verdict
                        progress.json  rank 0's last beat: step and time, every second

Train, the cluster verbs, profiling, the runs index and the CLI name these files through this
module only. Besides the run directories, one file per user: the job ledger
(jobs.jsonl: job id -> run directory, and which job continues which) and the output
directories runs were written to (output_dirs), both in ~/.local/state/hpctrain (or
$XDG_STATE_HOME/hpctrain).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpctrain.readers import (AMOUNT, COUNT, FINITE, MAPPING, NUMBER, SECONDS, SHARE, GiB,
                              KiB, MiB, TEXT, TIME, Unreadable, one_of,
                              capped_lines, field_problem, json_document, list_of, optional,
                              parse_json, yaml_mapping)
from hpctrain.writers import open_appending, own_folder

CONFIG = "config.yaml"
IDENTITY = "run.json"
LOCK = "run.lock"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
# torch's compiled kernels (compile_cache: run), a folder per torch, Triton and device:
# written by torch's compiler, whose files hpctrain neither writes nor reads
COMPILE_CACHE = "compile-cache"
# the same, in the output folder (compile_cache: shared): every run of it reads and adds
# to it; hidden, so that no run name's folder can be it
SHARED_COMPILE_CACHE = ".compile-cache"
TENSORBOARD = "tb"
PROFILE = "profile"
PROFILE_SUMMARY = "profile.json"  # in profile/: hpctrain profile's verdict and figures
REPORT = "report.html"
JOB_SCRIPT = "job.sbatch"
JOB_RECORD = "job.json"
MEMORY_PREDICTION = "{recipe}-memory.json"  # hpctrain memory --out RUN_DIR writes it there
AUTOTUNE = "autotune"  # a job submitted with --autotune: its trials, in the run directory
TUNED_RECIPE = "tuned.yaml"  # in autotune's folder: the pick, as a recipe to train
CHECKPOINT_META = "meta.json"  # inside each checkpoint folder, written last
# beside it: what a LightningModule's on_save_checkpoint added (tensors and plain values)
CHECKPOINT_MODULE_STATE = "module.pt"
# folders another library writes in a run directory, links of its own included (W&B's
# latest-run, and its log linked to ~/.cache/wandb): hpctrain writes nothing inside
LIBRARY_FOLDERS = ("wandb",)
PROGRESS = "progress.json"  # rank 0's progress, written every second (monitor/hangs.py)
HANG = "hang"  # the latest hang (monitor/hangs.py): each rank's stacks, its view, the verdict
HANG_STACKS = "rank-{rank}.txt"  # every thread of the rank and of its loader workers
HANG_VIEW = "rank-{rank}.json"  # where the rank hangs, as it sees it
HANG_VERDICT = "hang.json"  # the one line that names the hang, and every rank's view
CHECKPOINT_NAME = re.compile(r"^step_(\d{8,})$")
SET_ASIDE = "set-aside-{time}"  # in checkpoints/: what a resume took out of the run's history
# a new run's folder: its recipe's name and when it was made (runs/lock.claim_new adds -2, -3
# where two start in the same second); resume=auto finds a recipe's runs by it, so hpctrain
# run and hpctrain submit name them alike
RUN_NAME = "{recipe}-{stamp}"
STAMP_FORMAT = "%Y%m%d-%H%M%S"
STAMP = r"\d{8}-\d{6}(?:-\d+)?"  # a stamp as a run's name ends with it
SET_ASIDE_REASONS = "why.json"
# the most each file read back may hold: larger is damage, never read (a link to /dev/zero,
# a sparse file of 100 GB); metrics.jsonl at 1 GiB is some ten million intervals
CAPS = {CONFIG: 4 * MiB, IDENTITY: 64 * MiB, LOCK: 64 * KiB, METRICS: GiB, SUMMARY: 16 * MiB,
        CHECKPOINT_META: 64 * MiB, PROFILE_SUMMARY: 256 * MiB, MEMORY_PREDICTION: 16 * MiB,
        JOB_RECORD: 64 * KiB, HANG_VIEW: MiB, HANG_VERDICT: 16 * MiB, PROGRESS: 64 * KiB}
RECORD_CAP = MiB  # one metrics.jsonl line
# what a metrics.jsonl record must hold to be read (train/telemetry.py writes them): a kind,
# and where there, what places it (step, time, spent) whole and finite; a figure such as a
# loss may be NaN
METRIC_RULES = {
    "kind": TEXT, "step": COUNT, "time": TIME, "epoch": FINITE, "elapsed_seconds": SECONDS,
    "eval_seconds": SECONDS, "device_hours": AMOUNT, "energy_joules": optional(AMOUNT),
    "memory_used_bytes": list_of(optional(COUNT)), "utilization": list_of(optional(FINITE)),
    "power_watts": list_of(optional(FINITE)), "step_seconds": list_of(SECONDS),
    "utilization_mean": optional(FINITE), "power_watts_total": optional(FINITE),
    "seconds_per_step": optional(SECONDS),
}
# how a run ended, as summary.json's `status` says (a search's trial may end pruned); anything
# else there is damage, where `watch` waited on a status it did not know for ever
RUN_STATUSES = ("completed", "failed", "preempted", "interrupted", "hung", "pruned")
# what summary.json's figures that others compute with must hold to be read back (a scaling
# study divides by its throughput and epochs, a search ranks by its objective, the runs index
# adds its device-hours): a figure broken is damage, named, where it was a traceback
SUMMARY_RULES = {
    "status": one_of(*RUN_STATUSES), "steps": COUNT, "epochs": optional(AMOUNT),
    "restarts": COUNT,
    "global_batch_size": optional(COUNT), "batch_size_per_device": optional(COUNT),
    "grad_accum_steps": optional(COUNT), "world_size": optional(COUNT),
    "samples_per_second": optional(AMOUNT), "tokens_per_second": optional(AMOUNT),
    "images_per_second": optional(AMOUNT), "data_wait_fraction": optional(SHARE),
    "wall_seconds": optional(SECONDS), "job_seconds": optional(SECONDS),
    "stop_seconds": optional(SECONDS), "device_hours": optional(AMOUNT),
    "energy_joules": optional(AMOUNT), "samples_per_joule": optional(AMOUNT),
    "mfu": optional(AMOUNT), "peak_memory_bytes": optional(COUNT),
    "best_val_accuracy": optional(NUMBER), "final_val_accuracy": optional(NUMBER),
    "best_val_loss": optional(NUMBER), "device": optional(TEXT),
    "straggler": optional(MAPPING), "layout": optional(MAPPING), "compiled": optional(MAPPING),
}
# what progress.json must hold to be read back: whose beat (the process, when it began) and
# where it stood (the steps trained, the phase) at `time`
PROGRESS_RULES = {"pid": COUNT, "host": TEXT, "began": TIME, "time": TIME, "step": optional(COUNT),
                  "phase": TEXT}
# what a hang's verdict must hold to be read back (monitor/hangs.py writes it)
VERDICT_RULES = {"line": TEXT, "time": TIME, "step": optional(COUNT), "phase": TEXT,
                 "silent_seconds": AMOUNT, "bound_seconds": AMOUNT, "ranks": list_of(MAPPING)}
# the user's state folder ($XDG_STATE_HOME/hpctrain, ~/.local/state/hpctrain by default)
LEDGER = "jobs.jsonl"
LEDGER_CAP = 256 * MiB  # a million jobs
OUTPUT_DIRS = "output_dirs"  # where runs were written
OUTPUT_DIRS_CAP = 64 * MiB  # some hundred thousand folders
# the job ledger as a batch script's shell names it
SHELL_LEDGER = "${XDG_STATE_HOME:-$HOME/.local/state}/hpctrain/" + LEDGER


def stamp() -> str:
    """Now, as run names, set-aside folders and kept-aside files say it."""
    return time.strftime(STAMP_FORMAT)


def new_run_name(recipe: str) -> str:
    """The name of a new run of `recipe` started now."""
    return RUN_NAME.format(recipe=recipe, stamp=stamp())


def is_run_of(folder: str, recipe: str) -> bool:
    """Whether `folder` is named as a run of `recipe` (exactly: not of `recipe-v2`)."""
    before, after = RUN_NAME.format(recipe=recipe, stamp="{stamp}").split("{stamp}")
    return re.fullmatch(re.escape(before) + STAMP + re.escape(after), folder) is not None


def mark_changed(run_dir: Path) -> None:
    """Touch the folder holding a run whose run.json or summary.json was just replaced: the
    runs index lists a folder of finished runs again only when its time changed
    (runs/index.py). A folder this user may not touch is left as it is: there `hpctrain runs
    --rescan` finds the change."""
    try:
        os.utime(run_dir.parent)
    except OSError:
        pass


@dataclass(frozen=True)
class RunDir:
    """One run directory's files by name."""

    path: Path

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def identity(self) -> Path:
        return self.path / IDENTITY

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def compile_cache(self) -> Path:
        return self.path / COMPILE_CACHE

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def profile(self) -> Path:
        return self.path / PROFILE

    @property
    def report(self) -> Path:
        return self.path / REPORT

    @property
    def progress(self) -> Path:
        return self.path / PROGRESS

    def read_progress(self) -> dict | None:
        """progress.json, checked field by field; None when absent or damaged (it is
        rewritten every second: a crash may leave none)."""
        value, why = json_document(self.progress, CAPS[PROGRESS])
        if why is not None or not isinstance(value, dict) or \
                field_problem(value, PROGRESS_RULES, tuple(PROGRESS_RULES)):
            return None
        return value

    @property
    def hang(self) -> Path:
        return self.path / HANG

    def hang_file(self, name: str, rank: int | None = None) -> Path:
        """One of the hang folder's files: HANG_STACKS or HANG_VIEW of `rank`, HANG_VERDICT."""
        return self.hang / name.format(rank=rank)

    def read_hang(self) -> tuple[dict | None, str | None]:
        """The latest hang's verdict (hang.json): (verdict, None); (None, why) when damaged;
        (None, None) when the run never hung."""
        value, why = json_document(self.hang_file(HANG_VERDICT), CAPS[HANG_VERDICT])
        if why is None and value is not None and (
                not isinstance(value, dict) or (why := field_problem(value, VERDICT_RULES,
                                                                     ("line",)))):
            why = why if isinstance(value, dict) else "is not a JSON object"
        return (None, f"{HANG_VERDICT} {why}") if why else (value, None)

    def memory_predictions(self) -> list[Path]:
        return sorted(self.path.glob(MEMORY_PREDICTION.format(recipe="*")))

    def report_pictures(self) -> list[Path]:
        """The PNGs written beside report.html (report-loss.png, ...)."""
        return sorted(self.path.glob(f"{Path(REPORT).stem}-*.png"))

    @property
    def job_script(self) -> Path:
        return self.path / JOB_SCRIPT

    @property
    def job_record(self) -> Path:
        return self.path / JOB_RECORD

    def job_log(self, name: str, job_id: str, err: bool = False) -> Path:
        """A job's log, by its scheduler's log `name` (its `JOB_LOG`)."""
        return self.path / name.format(job=job_id, stream="err" if err else "out")

    def job_logs(self, names: tuple[str, ...]) -> list[Path]:
        """Every job log in the folder named as one of `names` (every scheduler's log name):
        all jobs of a chain, both streams."""
        return sorted({path for name in names
                       for path in self.path.glob(name.format(job="*", stream="*"))})

    def read_metrics(self) -> tuple[list[dict], int, str | None]:
        """metrics.jsonl's records; how many lines were not records (cut by a crash, or
        damaged); and the first damaged one named (a record breaking METRIC_RULES: a step of
        1e23, a time of Infinity; a line nested 100,000 deep), None when the others were
        merely cut. A file that cannot be read at all (a link, larger than its cap) is
        named, with no records."""
        records, bad, damage = [], 0, None
        try:
            for number, line in enumerate(capped_lines(self.metrics, CAPS[METRICS],
                                                       RECORD_CAP), 1):
                record, why = metric_record(line) if line is not None else \
                    (None, f"longer than {RECORD_CAP:,} bytes")
                if record is not None:
                    records.append(record)
                    continue
                bad += 1
                if why is not None and damage is None:
                    damage = f"{METRICS} line {number}: {why}"
        except FileNotFoundError:
            return [], 0, None
        except Unreadable as err:
            return [], 1, f"{METRICS} {err}"
        except OSError:
            return [], 0, None
        return records, bad, damage

    def read_summary(self) -> dict | None:
        """summary.json, or None when missing or unreadable (a crash may have cut it)."""
        return self.summary_and_damage()[0]

    def summary_and_damage(self) -> tuple[dict | None, str | None]:
        """(summary.json, None); (None, why) when it is there but cannot be read (cut
        short, not a JSON object, a link); (None, None) when absent."""
        value, why = json_document(self.summary, CAPS[SUMMARY])
        if why is None and value is not None and not isinstance(value, dict):
            why = "is not a JSON object"
        if why is None and value is not None and \
                (broken := field_problem(value, SUMMARY_RULES)) is not None:
            why = f"is damaged: {broken}"
        return (None, f"{SUMMARY} {why}") if why else (value, None)

    def read_config(self) -> dict | None:
        return yaml_mapping(self.config, CAPS[CONFIG])

    def list_checkpoints(self) -> list[Path]:
        return list_checkpoints(self.checkpoints)

    def first_link(self) -> Path | None:
        """The first symbolic link inside the run directory, at any depth (walked without
        following one); None when it holds none. A run writes its files and folders in
        place, so a link among them would take what it writes elsewhere (the folder itself
        may be a link: where the user keeps runs is theirs to choose). Inside a tracker's
        own folder (LIBRARY_FOLDERS) the library's links are its own."""
        folders = [self.path]
        while folders:
            try:
                with os.scandir(folders.pop()) as entries:
                    for entry in entries:
                        if entry.is_symlink():
                            return Path(entry.path)
                        if entry.is_dir(follow_symlinks=False) and not (
                                Path(entry.path).parent == self.path and
                                entry.name in LIBRARY_FOLDERS):
                            folders.append(Path(entry.path))
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed meanwhile
        return None


def metric_record(line: str | bytes) -> tuple[dict | None, str | None]:
    """One metrics.jsonl line: (record, None); (None, why) when it is a JSON object breaking
    METRIC_RULES or nested too deep; (None, None) when it is no JSON object (cut by a crash,
    or by a seek)."""
    try:
        record = parse_json(line)
    except Unreadable as err:
        return None, str(err)
    except ValueError:  # not JSON; not UTF-8 (UnicodeDecodeError is a ValueError)
        return None, None
    if not isinstance(record, dict):
        return None, None
    why = field_problem(record, METRIC_RULES, ("kind",))
    return (record, None) if why is None else (None, why)


def modified(path: Path) -> float | None:
    """The file's modification time, None when it is not there."""
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def size_of(path: Path) -> int:
    """The file's size in bytes, 0 when it is not there."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def list_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints in `folder` (their meta.json written), oldest first."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := CHECKPOINT_NAME.match(p.name)) and (p / CHECKPOINT_META).is_file()]
    return [p for _, p in sorted(found)]


def is_checkpoint(path: Path) -> bool:
    """One checkpoint folder (run_dir/checkpoints/step_N), as `resume=` may name it."""
    return (path / CHECKPOINT_META).is_file()


def run_of_checkpoint(checkpoint: Path) -> Path:
    return checkpoint.parent.parent


# ---- the output directories runs were written to: where `hpctrain runs` looks


def state_dir() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / \
        "hpctrain"


def node_limits_path() -> Path:
    """This host's limits as `hpctrain bench node` measured them (bench/node.py); the MFU
    divides by them (train/hardware/mfu.py)."""
    return state_dir() / "node" / f"{socket.gethostname().split('.')[0]}.json"


def output_dirs_path() -> Path:
    return state_dir() / OUTPUT_DIRS


def remember_output_dir(folder: Path) -> None:
    """Add `folder` to the list (once); a list that cannot be written is no reason to stop a
    run: `hpctrain runs --root` finds it then."""
    path = output_dirs_path()
    try:
        if str(folder) in known_output_dirs():
            return
        with open_appending(own_folder(path.parent) / path.name) as listed:
            listed.write(f"{folder}\n")
    except OSError:  # a link there too (OutputError is said by the run's other writes)
        pass


def known_output_dirs() -> list[str]:
    try:
        return [line.decode(errors="replace").rstrip("\n") for line in
                capped_lines(output_dirs_path(), OUTPUT_DIRS_CAP, RECORD_CAP)
                if line is not None and line.strip()]
    except (OSError, ValueError):  # absent, a link, past its cap
        return []


# ---- the job ledger: every job `hpctrain submit` sent, and the continuations its scripts sent


def ledger_path() -> Path:
    return state_dir() / LEDGER


def remember_job(job_id: str, run_dir: Path) -> None:
    with open_appending(own_folder(state_dir()) / LEDGER) as ledger:  # never through a link
        ledger.write(json.dumps({"job_id": job_id, "run_dir": str(run_dir),
                                 "submitted": round(time.time())}) + "\n")


def read_ledger() -> list[dict]:
    """The remembered jobs, oldest first. A line that is not a job record (torn by a crash,
    or written by something else) is skipped, and said unless merely torn."""
    path = ledger_path()
    rows = []
    try:
        lines = list(capped_lines(path, LEDGER_CAP, RECORD_CAP))
    except FileNotFoundError:
        return []
    except (OSError, Unreadable) as err:
        print(f"hpctrain: warning: cannot read the job ledger {path} "
              f"({getattr(err, 'strerror', None) or err})", file=sys.stderr)
        return []
    for number, line in enumerate(lines, 1):
        try:
            row = parse_json(line) if line is not None else None
        except ValueError:
            continue
        if _is_job_record(row):
            rows.append(row)
        else:
            print(f"hpctrain: warning: {path}:{number} is not a job record; skipped",
                  file=sys.stderr)
    return rows


def _is_job_record(row) -> bool:
    """{"job_id": str, "run_dir": str, ...} with "continues" a str when there."""
    return isinstance(row, dict) and isinstance(row.get("job_id"), str) and \
        isinstance(row.get("run_dir"), str) and isinstance(row.get("continues", ""), str)
