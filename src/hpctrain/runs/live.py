"""What `hpctrain top` shows: each running run's latest telemetry, read from the end of its
metrics.jsonl over the shared file system (no daemon, nothing to start on the nodes): per
rank, the GPU's utilisation, memory and power from the last `gpu` record, the step time and
data wait from the same interval."""

from __future__ import annotations

from pathlib import Path

from hpctrain.readers import Unreadable, open_capped
from hpctrain.runs.directory import CAPS, METRICS, RunDir, metric_record

TAIL_BYTES = 256 * 1024  # the last records of a long metrics.jsonl


def tail_reading(metrics: Path) -> tuple[list[dict], str | None]:
    """The records among the file's last TAIL_BYTES, oldest first, and the first damaged line
    among them named (a record breaking directory.METRIC_RULES), None when there is none."""
    try:
        with open_capped(metrics, CAPS[METRICS]) as file:
            file.seek(0, 2)
            size = file.tell()
            file.seek(max(0, size - TAIL_BYTES))
            text = file.read(TAIL_BYTES).decode(errors="replace")
    except Unreadable as err:
        return [], f"{metrics.name} {err}"
    except OSError:
        return [], None
    records, damage = [], None
    for line in text.splitlines():  # the first line cut by the seek, or one being written: out
        record, why = metric_record(line)
        if record is not None:
            records.append(record)
        elif why is not None and damage is None:
            damage = f"{metrics.name}: a line left out: {why}"
    return records, damage


def latest_records(metrics: Path) -> dict[str, dict]:
    """kind -> the newest record of that kind among the file's last TAIL_BYTES."""
    return {record["kind"]: record for record in tail_reading(metrics)[0]}


def rank_rows(run_dir: Path, hosts: list[str] | None = None) -> list[dict]:
    """One row per rank of the run's latest interval (a run on CPUs: one row, no GPU)."""
    latest = latest_records(RunDir(run_dir).metrics)
    gpu, train = latest.get("gpu"), latest.get("train", {})
    if gpu is None:
        return [{"rank": 0, "step": train.get("step"), "utilization": None,
                 "memory_used_bytes": None, "power_watts": None,
                 "step_seconds": None, "data_wait_fraction": train.get("data_wait_fraction"),
                 "time": train.get("time")}]
    count = len(gpu.get("utilization") or [])
    rows = []
    for rank in range(count):
        def at(key):
            values = gpu.get(key) or []
            return values[rank] if rank < len(values) else None
        rows.append({"rank": rank, "step": gpu.get("step"), "utilization": at("utilization"),
                     "memory_used_bytes": at("memory_used_bytes"),
                     "power_watts": at("power_watts"), "temperature_c": at("temperature_c"),
                     "step_seconds": at("step_seconds"),
                     "data_wait_fraction": at("data_wait_fraction"),
                     "throttle": at("throttle"), "time": gpu.get("time")})
    return rows
