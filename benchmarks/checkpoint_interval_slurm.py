"""The checkpoint interval against stops without a word, on a real Slurm cluster: the same
seeded stops injected into real jobs for `checkpoint.every=auto`, fixed intervals and one save
an epoch, each run's waste read from `hpctrain goodput` (what the scheduler's accounting says
the run's jobs held, less the training, data waits and evaluations it did).

A throw-away Slurm cluster with accounting is started here (tests/slurm_cluster.py, other
ports than the tests' own; needs root, as the tests do). Each policy trains the tests' tiny
CNN (16 px shapes, batch 16, an epoch of 10 steps) for `--steps` steps, submitted with
`hpctrain submit`; a job is killed with SIGKILL (no save, no word) `--mtbf`-exponential
seconds after it starts running, the draws seeded and the same for every policy, and the run
is submitted again (resume=auto: from its last checkpoint, or from the start where a stop came
before the first) until it completes. `auto` is told the stops' rate as its
prior (`checkpoint.prior_stop_hours`), as a site that knows its failure rate would. The ratio
is a policy's mean waste over the best fixed interval's.

    python benchmarks/checkpoint_interval_slurm.py                      # about 6 minutes
    python benchmarks/checkpoint_interval_slurm.py --policies auto,epoch --steps 100 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from growth import TESTS

USEFUL = ("productive", "data_wait", "evaluation")  # the same work whatever the policy


def policy_overrides(policy: str, mtbf: float) -> list[str]:
    if policy == "auto":
        return ["checkpoint.every=auto", f"checkpoint.prior_stop_hours={mtbf / 3600:.6g}"]
    if policy == "epoch":
        return ["checkpoint.every_epochs=1"]
    return [f"checkpoint.every_steps={int(policy.removeprefix('steps:'))}"]


def killed(marker: str) -> int:
    """SIGKILL to every process of the run whose command line holds `marker`; how many."""
    from slurm_cluster import python_processes

    return sum(subprocess.run(["kill", "-9", proc.name], check=False).returncode == 0
               for proc in python_processes(marker))


def finished(job, timeout: float = 120) -> str:
    from hpctrain.cluster.records import FINAL_STATES

    deadline = time.monotonic() + timeout
    while (state := job.state) not in FINAL_STATES:
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job.id} still {state} after {timeout} s")
        time.sleep(0.1)
    return state


def one_run(policy: str, seed: int, args, base: list[str]) -> dict:
    """Train to the end under seeded stops; the run's goodput account and its stops."""
    from hpctrain.cluster import slurm
    from hpctrain.cluster.jobs import submit

    name = f"{policy.replace(':', '')}-{seed}"
    draws = random.Random(seed)
    overrides = [*base, f"run_name={name}", *policy_overrides(policy, args.mtbf)]
    job, stops = submit("default", overrides, gpus=1, time_limit="30"), 0
    while True:
        while job.state == "PENDING":
            time.sleep(0.05)
        end = time.monotonic() + draws.expovariate(1 / args.mtbf)
        while time.monotonic() < end and job.state == "RUNNING":
            time.sleep(0.1)
        while job.state == "RUNNING" and not killed(f"run_name={name}"):
            time.sleep(0.05)  # the job's script has not started hpctrain yet
        if finished(job) == "COMPLETED":
            break
        stops += 1
        job = submit("default", [*overrides, "resume=auto"], gpus=1, time_limit="30")
    if (state := finished(job)) != "COMPLETED":
        raise RuntimeError(f"{name}: job {job.id} ended {state}: {job.logs(err=True)[-2000:]}")
    deadline = time.monotonic() + 30  # accounting hears of the end a little after the queue
    while (slurm.accounting(job.id) or {}).get("state") != "COMPLETED" and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    done = subprocess.run([sys.executable, "-m", "hpctrain", "goodput", job.id, "--json"],
                          capture_output=True, text=True, check=True)
    return {**json.loads(done.stdout), "stops": stops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default="auto,epoch,steps:25,steps:100,steps:400")
    parser.add_argument("--steps", type=int, default=3000, help="steps each run trains")
    parser.add_argument("--mtbf", type=float, default=12.0,
                        help="mean seconds of a job's life between stops")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--cache-dir", help="where the shapes dataset is kept")
    args = parser.parse_args()
    sys.path.insert(0, str(TESTS))
    from slurm_cluster import LocalSlurm

    policies = args.policies.split(",")
    results: dict[str, list[dict]] = {policy: [] for policy in policies}
    with tempfile.TemporaryDirectory() as folder:
        cache = args.cache_dir or str(Path(folder) / "cache")
        base = [f"output_dir={folder}/runs", f"data.shapes.cache_dir={cache}",
                "data.shapes.num_train=160", "data.shapes.num_val=40",
                "data.shapes.image_size=16", "data.images.image_size=16", "data.num_workers=0",
                "model.name=hpctrain:tiny_cnn", "train.batch_size=16", "train.epochs=100000",
                f"train.max_steps={args.steps}", "train.eval_every_epochs=100000",
                "train.log_every=5", "tensorboard=false", "report=false"]
        cluster = LocalSlurm(Path(folder) / "slurm", name="intervals", nodes=("i1",),
                             port=17217, accounting=True)
        os.environ.update(SLURM_CONF=str(cluster.conf), HOME=f"{folder}/home",
                          XDG_STATE_HOME=f"{folder}/home/state")
        cluster.start()
        try:
            for seed in range(args.seeds):
                for policy in policies:
                    results[policy].append(one_run(policy, seed, args, base))
        finally:
            cluster.stop()
    report(results, args)


def report(results: dict[str, list[dict]], args) -> None:
    waste = {policy: statistics.mean(
        r["allocated_device_seconds"] - sum(r["device_seconds"][p] for p in USEFUL)
        for r in runs) for policy, runs in results.items()}
    fixed = [p for p in waste if p.startswith("steps:")]
    best = min(fixed, key=waste.get) if fixed else min(waste, key=waste.get)
    print(f"checkpoint_interval_slurm: {args.steps} steps of the tiny CNN per run, stops "
          f"without a word every {args.mtbf:g} s of a job's life (exponential, seeded), "
          f"{args.seeds} seed(s); allocated device-seconds from the scheduler's accounting")
    print(f"{'policy':<16}{'allocated s':>12}{'waste s':>9}{'saves s':>9}{'lost s':>8}"
          f"{'stops':>7}{'ratio':>8}")
    for policy, runs in results.items():
        mean = lambda key: statistics.mean(key(r) for r in runs)  # noqa: E731
        print(f"{policy:<16}{mean(lambda r: r['allocated_device_seconds']):>12.1f}"
              f"{waste[policy]:>9.1f}{mean(lambda r: r['device_seconds']['checkpoint']):>9.1f}"
              f"{mean(lambda r: r['device_seconds']['lost_work']):>8.2f}"
              f"{mean(lambda r: r['stops']):>7.1f}{waste[policy] / waste[best]:>8.3f}")
    print(f"best fixed interval: {best}" if fixed else f"no fixed interval; best: {best}")


if __name__ == "__main__":
    main()
