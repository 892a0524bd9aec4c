"""`hpctrain autotune`: real trials (each an `hpctrain run` process) of a small recipe whose
model fails as a GPU would (tests/fixtures/autotune_net.py).

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_autotune.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import child_processes, running

from hpctrain.config import load_config

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_a_hang_and_an_out_of_memory_are_recorded_and_the_pick_keeps_the_optimisation(
        tmp_path, run_cli, tiny):
    recipe = tiny(f"model.name={FIXTURES / 'autotune_net.py'}:build",
                  "train.global_batch_size=64", "train.grad_accum_steps=2", "train.epochs=200",
                  "data.val_batch_size=32")
    folder = tmp_path / "tune"
    # 60 s: room for the micro-batch trials after the 14 s hang, cold starts included (45 s
    # left them out on a slower 2-core machine, 4 runs in 5)
    code, out, err = run_cli("autotune", "default", *recipe, "--dir", str(folder),
                             "--fix", "compile", "--fix", "channels_last", "--fix",
                             "data.num_workers", "--warmup-steps", "2", "--measure-steps", "4",
                             "--trial-seconds", "14", "--budget", "60s")
    assert code == 0, err
    document = json.loads((folder / "autotune.json").read_text())
    trials = {tuple(sorted(t["settings"])): t for t in document["trials"]}
    hung = trials[("precision=bf16",)]
    assert hung["status"] == "timed out" and "14 s" in hung["why"]
    whole = trials[("train.global_batch_size=64", "train.grad_accum_steps=1")]
    assert whole["status"] == "out of memory" and "train.batch_size=64" in whole["why"]
    assert document["spent_seconds"] <= 75 and document["confirmation"]["status"] == "measured"
    assert not subprocess.run(["pgrep", "-f", str(folder)], capture_output=True).stdout
    given, tuned = load_config("default", recipe), load_config(str(folder / "tuned.yaml"))
    assert tuned.train.global_batch_size == 64 and tuned.precision == given.precision
    assert tuned.optim == given.optim and tuned.schedule == given.schedule
    assert tuned.train.epochs == given.train.epochs
    assert "timed out: no end within 14 s" in out and "out of memory: exit 1" in out
    assert f"tuned recipe: {folder / 'tuned.yaml'}" in out


def test_ctrl_c_kills_the_running_trial_and_keeps_the_trials_so_far(tmp_path, tiny):
    """The trial runs in a session of its own, so the terminal's Ctrl-C reaches autotune only:
    it kills the trial's whole group (the hang under bf16 here), writes what it measured and
    ends with 130."""
    import signal
    import time

    folder = tmp_path / "tune"
    child = _autotune(folder, tiny, measure_steps=4)
    deadline = time.monotonic() + 120
    while not (folder / "logs" / "trial-01.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # the hung trial is in its forward
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    document = json.loads((folder / "autotune.json").read_text())
    assert [t["status"] for t in document["trials"]] == ["measured"]
    assert document["pick"] == 0 and document["confirmation"] is None
    assert "interrupted (Ctrl-C) after 1 trials" in out
    assert not subprocess.run(["pgrep", "-f", str(folder)], capture_output=True).stdout


def test_a_sigkill_of_autotune_ends_its_running_trial_and_a_second_one_continues_the_folder(
        tmp_path, tiny, run_cli):
    """The trial's session is its own, so nothing of Slurm's or the terminal's reaches it:
    before, it trained on for good after its autotune was killed with SIGKILL. A second
    autotune into the folder is refused while the first lives, and after it numbers its
    trials after the first one's (before: it ran into their run directories, exit 1, 'the
    recipe as given does not train')."""
    import os
    import signal
    import time

    folder = tmp_path / "tune"
    tuner = _autotune(folder, tiny, measure_steps=100000)
    deadline = time.monotonic() + 120
    while not list(folder.glob("trials/*/progress.json")):
        assert tuner.poll() is None, tuner.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "no trial began within 120 s"
        time.sleep(0.2)
    trial = child_processes(tuner.pid)
    assert trial, "no trial process under autotune"
    again = [*tiny(f"model.name={FIXTURES / 'autotune_net.py'}:build", "train.batch_size=16",
                   "train.epochs=200"), "--dir", str(folder), "--fix", "compile",
             "--warmup-steps", "2", "--measure-steps", "2", "--budget", "1s", "--no-confirm"]
    code, _, err = run_cli("autotune", "default", *again)
    assert code == 2 and f"--dir: {folder} is in use by process " in err, err
    tuner.kill()
    tuner.communicate()
    deadline = time.monotonic() + 10  # the trial would train on for minutes
    try:
        while any(map(running, trial)):
            assert time.monotonic() < deadline, "the trial outlived its autotune"
            time.sleep(0.1)
    finally:  # not left training beside the suite
        for pid in filter(running, trial):
            os.kill(pid, signal.SIGKILL)
    first = {p.name: sorted(q.name for q in p.rglob("*")) for p in (folder / "trials").iterdir()}
    assert list(first) == ["trial-00"]
    code, _, err = run_cli("autotune", "default", *again)
    assert code == 0, err
    document = json.loads((folder / "autotune.json").read_text())
    numbers = [t["number"] for t in document["trials"]]
    assert numbers[0] == 1 and document["pick"] in numbers
    assert sorted(q.name for q in (folder / "trials" / "trial-00").rglob("*")) == \
        first["trial-00"]  # the first search's trial as it left it


def _autotune(folder: Path, tiny, measure_steps: int) -> subprocess.Popen:
    """`hpctrain autotune` of the tiny recipe on autotune_net (whose bf16 trial hangs),
    compile fixed, started in the background."""
    import sys

    recipe = tiny(f"model.name={FIXTURES / 'autotune_net.py'}:build", "train.batch_size=16",
                  "train.epochs=200")
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "autotune", "default", *recipe, "--dir", str(folder),
         "--fix", "compile", "--warmup-steps", "2", "--measure-steps", str(measure_steps)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
