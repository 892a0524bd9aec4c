"""The checkpoint interval against unwarned stops, simulated: Daly's interval (what
`checkpoint.every=auto` is to choose, train/checkpoints/interval.py) against a sweep of fixed
intervals and against today's default, a checkpoint every epoch.

A run of `--work` hours of training saves every `interval` seconds of training, each save
blocking it for `--save` seconds; unwarned stops (a lost node, kill -9) come as a Poisson
process over its wall time, seeded, at one per `--mtbf` hours; each loses the training since
the last checkpoint and costs `--restart` seconds (the queue, start-up, the resume's load).
The waste is the wall time beyond the work, the mean over `--runs` seeded runs. Each row's
ratio is its waste over the best fixed interval's.

    python benchmarks/checkpoint_interval.py                       # one stop an hour
    python benchmarks/checkpoint_interval.py --mtbf 8 --save 120 --epoch-minutes 30
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from hpctrain.train.checkpoints.interval import daly_interval  # noqa: E402


def wall_time(work: float, interval: float, save: float, mtbf: float, restart: float,
              rng: random.Random) -> float:
    """One run's wall seconds to train `work` seconds, checkpointing every `interval`."""
    done, wall = 0.0, 0.0
    next_stop = rng.expovariate(1 / mtbf)
    while done < work:
        segment = min(interval, work - done)
        needed = segment + (save if done + segment < work else 0.0)  # no save at the end
        if wall + needed <= next_stop:
            wall += needed
            done += segment
            continue
        wall = next_stop + restart  # the segment's training lost, and the restart
        next_stop = wall + rng.expovariate(1 / mtbf)
    return wall


def mean_waste(interval: float, args, seed: int = 0) -> float:
    rng = random.Random(seed)  # the same stops for every interval
    work = args.work * 3600
    return statistics.mean(
        wall_time(work, interval, args.save, args.mtbf * 3600, args.restart, rng) - work
        for _ in range(args.runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=float, default=24.0, help="hours of training")
    parser.add_argument("--save", type=float, default=30.0, help="seconds a save blocks")
    parser.add_argument("--mtbf", type=float, default=1.0, help="hours between unwarned stops")
    parser.add_argument("--restart", type=float, default=120.0, help="seconds a restart costs")
    parser.add_argument("--epoch-minutes", type=float, default=60.0,
                        help="an epoch's training, today's default interval")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    sweep = [60 * minutes for minutes in (1, 2, 3, 5, 7, 10, 15, 20, 30, 45, 60, 90, 120)]
    fixed = {interval: mean_waste(interval, args) for interval in sweep}
    best = min(fixed, key=fixed.get)
    auto = daly_interval(args.save, args.mtbf * 3600)
    rows = [("best fixed interval (sweep)", best, fixed[best]),
            ("auto (Daly)", auto, mean_waste(auto, args)),
            ("every epoch (today's default)", args.epoch_minutes * 60,
             mean_waste(args.epoch_minutes * 60, args))]
    print(f"{args.work:g} h of training, saves of {args.save:g} s, one unwarned stop per "
          f"{args.mtbf:g} h, restarts of {args.restart:g} s; mean of {args.runs} seeded runs")
    print(f"{'interval':<32}{'minutes':>9}{'waste h':>9}{'waste %':>9}{'ratio':>8}")
    for name, interval, waste in rows:
        print(f"{name:<32}{interval / 60:>9.1f}{waste / 3600:>9.2f}"
              f"{100 * waste / (args.work * 3600):>9.1f}{waste / fixed[best]:>8.3f}")
    print("waste: wall time beyond the training (saves, lost training, restarts); ratio: to "
          "the best fixed interval of the sweep")


if __name__ == "__main__":
    main()
