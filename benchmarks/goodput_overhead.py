"""What goodput's accounting and the hang watch cost a training step (issues 55 and 65 ask
under 0.5 %): each piece they add to the loop, timed here, at the rate the loop calls it,
against a step's time.

Per step: whether an asynchronous save is writing, counted into the interval. Per logging
interval (`--log-every` steps): the save-dip count, and with checkpoint.every=auto the pacer's
update. Per checkpoint (`--checkpoint-every` steps): the job's seconds by phase written into
run.json, which holds `--jobs` starts and is rewritten whole (atomically). Once per job
(`--job-steps` steps): the records a resume forgets (`--records` lines read) and the new start.
The hang watch (issue 65): per step, the progress beat; twice a second, on the watch's own
thread, a look at the beats (the phase's bound, faulthandler's native timer re-armed); every
second rank 0's progress.json rewritten and the lock's beat (a touch of run.lock): these
take the interpreter's lock from the loop as long as they run, so they count at their rate
in the step's time.

The step is the default recipe's (resnet_small, 32 px, batch 128, SGD) on this machine, timed
here, or `--step-ms`. The ratio is the share of the step over the 0.5 % budget.

    python benchmarks/goodput_overhead.py
    python benchmarks/goodput_overhead.py --jobs 200 --step-ms 41     # the H200's default step
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402

from hpctrain.config.operation_settings import MonitorConfig  # noqa: E402
from hpctrain.models.model_names import build_model  # noqa: E402
from hpctrain.monitor.beats import Beats  # noqa: E402
from hpctrain.monitor.hangs import LOOK_SECONDS, PROGRESS_SECONDS, HangWatch  # noqa: E402
from hpctrain.runs.lock import LOCK_BEAT_SECONDS  # noqa: E402
from hpctrain.runs.identity import record_job, record_start  # noqa: E402
from hpctrain.train.bookkeeping import Clock, Interval  # noqa: E402
from hpctrain.train.checkpoints.interval import Pacer  # noqa: E402
from hpctrain.train.telemetry import forget_lost_records  # noqa: E402

BUDGET = 0.005


def step_seconds(batch: int, steps: int) -> float:
    """The median time of one training step of the default recipe's model on this CPU."""
    model = build_model("hpctrain:resnet_small", 10).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images = torch.randn(batch, 3, 32, 32).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (batch,))
    times = []
    for _ in range(steps + 2):
        began = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times[2:])


def per_call(function, number: int) -> float:
    """Seconds per call: the median of five rounds (a file written is not always as quick)."""
    return statistics.median(timeit.repeat(function, number=number, repeat=5)) / number


def pieces(args, folder: Path, step: float) -> list[tuple[str, float, float]]:
    """(what, seconds per call, calls per step) for each piece of the accounting and of the
    hang watch (`step`: a step's seconds, for what runs every second)."""
    class Saver:
        pending = None
    saver, interval, clock = Saver(), Interval(), Clock()
    pacer = Pacer(stops=1, hours=2.0, steps_per_epoch=args.checkpoint_every, prior_hours=24.0)

    def per_step():
        saving = saver.pending is not None
        interval.saving += saving

    def per_interval():
        clock.count_save_dip(1.0, 0.1, args.log_every, 0)
        pacer.update(0.1, 2.0)

    run = folder / "run"
    run.mkdir()
    start = {"time": time.time(), "claimed": time.time(), "restart": 0, "launcher": "none",
             "world_size": 1, "hosts": ["n1"], "output_dir": str(folder)}
    for _ in range(args.jobs):
        record_start(run, {}, dict(start))

    def per_checkpoint():
        record_job(run, args.jobs - 1, 120.0, 120.0 / 3600, None, clock.split(1000))

    metrics = folder / "metrics.jsonl"
    line = json.dumps({"kind": "train", "step": 1, "time": time.time(), "loss": 1.0,
                       "seconds_per_step": 0.05}) + "\n"

    def per_job():
        metrics.write_text(line * args.records)
        forget_lost_records(metrics, 0, None)
        record_start(run, {}, {**start, "redone_steps": 0}, None, 0.0)

    beats, settings = Beats(), MonitorConfig()
    watch = HangWatch(settings, beats)
    watch.place(folder / "run", 0, 1, time.time())
    (folder / "run" / "run.lock").write_text("{}")

    def look():
        faulthandler.dump_traceback_later(beats.bound(settings) - beats.silent() + 60,
                                          exit=True, file=sys.__stderr__)

    try:
        watching = [("per step: the progress beat", per_call(lambda: beats.beat("step", 7),
                                                              100_000), 1.0),
                    ("per 0.5 s: the watch looks, re-arms faulthandler", per_call(look, 2_000),
                     step / LOOK_SECONDS),
                    ("per s: progress.json rewritten", per_call(watch._write_progress, 200),
                     step / PROGRESS_SECONDS),
                    ("per s: the lock's beat", per_call(
                        lambda: os.utime(folder / "run" / "run.lock"), 20_000),
                     step / LOCK_BEAT_SECONDS)]
    finally:
        faulthandler.cancel_dump_traceback_later()
    return [*watching, ("per step: a save in flight, counted", per_call(per_step, 100_000), 1.0),
            ("per interval: save dip, pacer", per_call(per_interval, 10_000),
             1 / args.log_every),
            (f"per checkpoint: run.json of {args.jobs} jobs", per_call(per_checkpoint, 20),
             1 / args.checkpoint_every),
            (f"per job: {args.records:,} records forgotten, a start", per_call(per_job, 3),
             1 / args.job_steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=78,
                        help="steps between checkpoints (the default recipe's epoch)")
    parser.add_argument("--job-steps", type=int, default=624,
                        help="steps a job trains (the default recipe's)")
    parser.add_argument("--jobs", type=int, default=20, help="starts run.json holds")
    parser.add_argument("--records", type=int, default=1000,
                        help="metrics.jsonl lines a resume reads")
    parser.add_argument("--step-ms", type=float, help="a step's time (default: timed here)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10, help="steps timed for the step")
    args = parser.parse_args()
    step = args.step_ms / 1e3 if args.step_ms else step_seconds(args.batch, args.steps)
    with tempfile.TemporaryDirectory() as folder:
        rows = pieces(args, Path(folder), step)
    print(f"goodput_overhead: step {step * 1e3:.2f} ms ("
          f"{'given' if args.step_ms else 'the default recipe on this machine'}); log every "
          f"{args.log_every}, a checkpoint every {args.checkpoint_every} steps, a job of "
          f"{args.job_steps} steps")
    print(f"{'piece':<48}{'us/call':>12}{'us/step':>10}{'share':>10}{'/budget':>9}")
    total = 0.0
    for what, seconds, rate in rows:
        per_step = seconds * rate
        total += per_step
        print(f"{what:<48}{seconds * 1e6:>12.2f}{per_step * 1e6:>10.3f}"
              f"{per_step / step:>10.5%}{per_step / step / BUDGET:>9.4f}")
    print(f"{'all of it':<48}{'':>12}{total * 1e6:>10.3f}{total / step:>10.5%}"
          f"{total / step / BUDGET:>9.4f}")


if __name__ == "__main__":
    main()
