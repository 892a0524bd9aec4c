"""The run's record, written as it trains: what a start changed, the configuration and the
start in run.json (with its heartbeat and trackers), each checkpoint with this job's figures so
far, and at the end the summary, the report and what the trackers keep."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hpctrain.config import to_yaml
from hpctrain.errors import cannot_write
from hpctrain.monitor.beats import CHECKPOINT
from hpctrain.report import trackers
from hpctrain.report.page import write_run_report
from hpctrain.runs.directory import RunDir, remember_output_dir
from hpctrain.runs.goodput import account
from hpctrain.runs.identity import (Heartbeat, earlier_jobs, mark_hung, read_identity,
                                    record_job, record_start)
from hpctrain.runs.live_registration import register
from hpctrain.train import run_summary
from hpctrain.train.bookkeeping import Clock
from hpctrain.train.build import Parts
from hpctrain.train.checkpoints.progress_state import Progress
from hpctrain.train.checkpoints.resume import save
from hpctrain.train.telemetry import KEEP_GOING, Telemetry, write_summary
from hpctrain.writers import write_whole


def tell_start(parts: Parts, progress: Progress, telemetry: Telemetry, moved: str | None,
               changes: list[str]) -> None:
    """The banner, and what this start changed: checkpoints set aside, a stale lock taken
    over, settings changed since the checkpoint (also recorded in metrics.jsonl)."""
    telemetry.message(run_summary.banner(parts, parts.resume_from))
    if moved:
        telemetry.message(moved)
    if parts.place.lock.taken_over:
        telemetry.message(f"  took over {parts.place.lock.path}: {parts.place.lock.taken_over}")
    if changes:
        telemetry.message("  resuming with changed settings: " + "; ".join(changes)
                          + " (they apply from this step on)")
        telemetry.record("resume", progress.step, {"changes": changes})


def announce(parts: Parts, progress: Progress, clock: Clock, telemetry: Telemetry) -> Heartbeat:
    """Rank 0 writes the run's configuration and its identity with this start (run.json, whose
    heartbeat then beats until the run ends), takes the earlier jobs' figures from there (every
    start counts, also one that saved nothing), opens its trackers, and registers it in a
    shared index when the environment names one (HPCTRAIN_DB)."""
    run = RunDir(parts.run_dir)
    identity = {}
    for path, write in ((run.config, lambda: write_whole(run.config, to_yaml(parts.config))),
                        (run.identity, lambda: identity.update(record_start(
                            parts.run_dir, parts.config.model_dump(mode="json"),
                            {**run_summary.start_record(parts), "began": clock.began(),
                             "redone_steps": telemetry.redone_steps},
                            lost_start(parts, telemetry.forgotten_until),
                            telemetry.redone_seconds)))):
        try:
            write()
        except OSError as err:
            raise cannot_write(path, err, KEEP_GOING) from None
    clock.job_number = len(identity["starts"]) - 1
    for figure, value in earlier_jobs(identity, clock.job_number).items():
        setattr(progress, figure, value)
    telemetry.add_sinks(trackers.open_sinks(parts.config, parts.run_dir, identity))
    remember_output_dir(parts.run_dir.parent)
    return Heartbeat(run.identity, register(parts.distributed.env.runs_db,
                                            parts.run_dir)).start()


def lost_start(parts: Parts, last_record: float | None = None) -> dict | None:
    """The start whose lock this one took over: it died without a word (run.json). Its last
    beat is the latest of its lock's, the last progress.json it wrote (with the steps it had
    trained: `trained`; None where it wrote none) and its last record (`last_record`, the
    time of the last one this start forgot: each beat is a second apart, a record is written
    as a step ends)."""
    gone = parts.place.lock.gone
    if gone is None:
        return None
    holder, beat = gone
    progress = parts.place.lock.gone_progress
    return {"claimed": holder.started, "began": holder.began, "job_id": holder.job_id,
            "restart": holder.restart, "host": holder.host,
            "last_beat": max(beat, progress["time"] if progress else beat,
                             last_record or beat),
            "trained": progress["step"] if progress else None}


def save_checkpoint(parts: Parts, progress: Progress, clock: Clock,
                    telemetry: Telemetry) -> None:
    """A checkpoint of this step (skipped, and said, when the weights are not finite), and
    this job's figures so far into run.json."""
    parts.beats.beat(CHECKPOINT, progress.step)
    totals = run_summary.totals(parts, progress, clock)
    began = time.perf_counter()
    if not save(parts, progress, totals["job_seconds"], totals["job_energy_joules"]):
        telemetry.message(f"step {progress.step}: weights are not finite, checkpoint skipped")
    clock.last_save_seconds = time.perf_counter() - began  # (async: its blocking part)
    clock.checkpoint_seconds += clock.last_save_seconds
    if parts.distributed.is_main:  # its seconds to now: the save's among them
        _record_job(parts, clock, run_summary.totals(parts, progress, clock), progress.step)


def finish_saving(parts: Parts) -> None:
    """Wait for an asynchronous save and let rank 0 publish it before anyone moves on."""
    if parts.checkpointer.pending is not None:
        parts.beats.beat(f"{CHECKPOINT}: its write behind the steps")
    parts.checkpointer.wait()
    parts.distributed.barrier()


def _record_job(parts: Parts, clock: Clock, totals: dict, step: int) -> None:
    """This job's figures so far, and its seconds by phase, into its start in run.json
    (rank 0, once announced)."""
    if clock.job_number is not None:
        seconds = totals["job_seconds"]
        record_job(parts.run_dir, clock.job_number, seconds,
                   seconds * parts.world_size / 3600, totals["job_energy_joules"],
                   clock.split(step))


def close(parts: Parts, progress: Progress, clock: Clock, status: str,
          telemetry: Telemetry) -> tuple[dict, str | None]:
    """The run's summary as it ends (`status`: completed, preempted, pruned, interrupted,
    failed); rank 0 also writes it, the job's figures, the report, and hands the trackers
    their last. (the summary, why summary.json could not be written or None)."""
    run = run_summary.totals(parts, progress, clock)
    summary = run_summary.summary(parts, progress, clock, status, run)
    if not parts.distributed.is_main:
        return summary, None
    _record_job(parts, clock, run, progress.step)
    summary["goodput"] = _goodput(parts.run_dir)
    problem = write_summary(parts.run_dir, summary)
    if parts.config.report and (unwritten := write_run_report(parts.run_dir)):
        print(f"hpctrain: warning: {unwritten}", file=sys.stderr, flush=True)
    telemetry.finish(summary, _artifacts(parts.run_dir))
    return summary, problem


def record_hang(parts: Parts, progress: Progress, clock: Clock, line: str) -> int:
    """Rank 0, from the hang watch: this job's figures with its silent seconds apart and the
    hang's line into its start in run.json, and summary.json saying it hung (nothing else:
    the trackers and the report may be what hangs). The run's hangs so far, this one's
    included."""
    run = run_summary.totals(parts, progress, clock)
    _record_job(parts, clock, run, progress.step)
    hangs = mark_hung(parts.run_dir, clock.job_number, line) \
        if clock.job_number is not None else 1
    summary = run_summary.summary(parts, progress, clock, "hung", run)
    summary.update(hang=line, goodput=_goodput(parts.run_dir))
    write_summary(parts.run_dir, summary)
    parts.place.lock.release()  # recorded: the next start need not take it over
    return hangs


def record_end(parts: Parts, clock: Clock, step: int) -> None:
    """Rank 0, last of the run's records: this job's seconds to now, what it took after the
    summary (the report, the trackers' close) included."""
    if parts.distributed.is_main and clock.job_number is not None:
        seconds = time.perf_counter() - clock.started
        try:
            record_job(parts.run_dir, clock.job_number, seconds,
                       seconds * parts.world_size / 3600, None, clock.split(step),
                       keep_energy=True)
        except OSError:  # a full disk: the summary said so
            pass


def _goodput(run_dir: Path) -> float | None:
    """The run's goodput, every job so far this one's end included (runs/goodput.py); None
    where run.json is damaged or was not written."""
    record, _ = read_identity(run_dir)
    return account(record).goodput if record is not None else None


def _artifacts(run_dir: Path) -> list:
    """What the trackers keep of the run besides its figures: the report and the profile."""
    run = RunDir(run_dir)
    return [p for p in (run.report, *run.report_pictures(), run.profile) if p.exists()]
