"""`hpctrain submit`, `jobs`, `logs`, `status`, `cancel` and the Python API, against a real
two-node Slurm cluster started by the suite (slurm_cluster.py), plus the generated script.

Here the tests that start several processes or a server (torchrun, Slurm, PostgreSQL, the
browser, the model hub); the others are tests/unit/test_slurm.py, tests/runs/test_slurm.py."""

import json
import re
import shutil
import site
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from hpctrain.cluster import slurm
from hpctrain.cluster.jobs import Job, find_logs, submit
from hpctrain.runs.directory import RunDir, list_checkpoints
from hpctrain.train.checkpoints.safe_checkpoint import read_meta


@pytest.mark.slurm
def test_a_two_node_job_runs_to_completion_and_can_be_followed(slurm_cluster, home, tmp_path,
                                                               run_cli, tiny):
    marker = tmp_path / "pwned"
    code, out, err = run_cli("submit", "default", *tiny(
        "run_name=twonode", f"data.path=$(touch {marker})"), "--gpus", "2", "--nodes", "2",
        "--time", "10", "--json")
    assert code == 0, err
    submitted = json.loads(out)
    job = Job(submitted["job_id"])
    assert job.run_dir == tmp_path / "runs" / "twonode"
    assert job.wait(timeout=240, poll=0.2) == "COMPLETED", job.logs(err=True)[-3000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["launcher"] == "slurm" and summary["steps"] == 5
    assert not marker.exists()

    code, out, _ = run_cli("logs", job.id)
    assert code == 0 and "2 processes (slurm, 2 node(s) x 1)" in out
    code, out, _ = run_cli("status", job.id, "--json")
    assert code == 0 and json.loads(out)["state"] == "COMPLETED"
    code, out, _ = run_cli("watch", job.id)  # the job has ended: one reading
    assert code == 0 and "completed (Slurm: COMPLETED), step 5/5" in out
    assert find_logs(job.id)[0].name == f"slurm-{job.id}.out"
    assert f"slurm-{job.id}.out" in [p.name for p in find_logs("2 processes (slurm")]

    slurm_cluster.forget_jobs()  # as after MinJobAge; this cluster keeps no accounting
    code, out, _ = run_cli("status", job.id, "--json")
    status = json.loads(out)
    assert code == 0 and (status["state"], status["source"]) == ("COMPLETED", "summary.json")
    assert status["steps"] == 5


def _see_this_interpreters_packages(venv):
    """Make a new venv import what this interpreter imports. --system-site-packages is not
    enough when the tests themselves run in a venv: it exposes the base Python's packages, not
    this venv's, and hpctrain would be missing. addsitedir also runs the .pth files there,
    which is how an editable install is found."""
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    dirs = [d for d in [*site.getsitepackages(), site.getusersitepackages()] if Path(d).is_dir()]
    (site_packages / "_this_interpreter.pth").write_text(
        f"import site; list(map(site.addsitedir, {dirs!r}))\n")


@pytest.mark.slurm
def test_a_job_runs_in_the_virtual_environment_it_was_given(slurm_cluster, home, tmp_path,
                                                            tiny):
    """--venv: the script activates it and srun runs that environment's python3 (one that
    sees this interpreter's packages, hpctrain included)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _see_this_interpreters_packages(venv)
    job = submit("default", tiny("run_name=in-venv", "train.max_steps=2"), gpus=1,
                 time_limit="10", venv=str(venv))
    assert job.wait(timeout=240, poll=0.2) == "COMPLETED", job.logs(err=True)[-3000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["software"]["python"] == str(venv / "bin" / "python3")
    assert summary["slurm_job_id"] == job.id


def running(job: Job, records: int = 2, timeout: float = 180) -> None:
    """Wait until the job's run has logged `records` more training intervals than now."""
    metrics = job.run_dir / "metrics.jsonl"
    count = lambda: metrics.read_text().count('"train"') if metrics.exists() else 0  # noqa
    wanted, deadline = count() + records, time.monotonic() + timeout
    while count() < wanted:
        assert time.monotonic() < deadline, job.status()
        time.sleep(0.2)


def stop_steps(job: Job) -> list[int]:
    return [int(s) for s in re.findall(r"stopped at step (\d+)", job.logs(err=True))]


def elapsed(job_id: str) -> float:
    details = slurm.job_details(job_id)[0]
    return (datetime.fromisoformat(details["EndTime"])
            - datetime.fromisoformat(details["StartTime"])).total_seconds()


@pytest.mark.slurm
def test_jobs_lists_and_cancel_stops_a_running_job(slurm_cluster, home, run_cli, tiny):
    """scancel sends SIGTERM to every process of the job, DataLoader workers included: the
    run saves and exits 75, and the job is not continued."""
    job = submit("default", tiny("run_name=long", "train.max_steps=100000",
                                 "data.num_workers=2", "train.log_every=5"), gpus=1,
                 time_limit="10")
    running(job)
    code, out, _ = run_cli("jobs", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["name"] for r in rows if r["id"] == job.id] == ["long"]
    code, out, _ = run_cli("jobs")
    assert code == 0 and job.id in out and "long" in out
    code, out, _ = run_cli("cancel", job.id)
    assert code == 0 and f"cancelled job {job.id}" in out
    assert job.wait(timeout=60, poll=0.5) == "CANCELLED"
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["status"] == "preempted"
    assert list_checkpoints(job.run_dir / "checkpoints")[-1].name == \
        f"step_{summary['steps']:08d}"
    err = job.logs(err=True)
    assert "SIGTERM received" in err and "task 0: Exited with exit code 75" in err
    assert "killed by signal" not in err and "exited unexpectedly" not in err
    assert job.chain() == [job.id]  # cancelled means stopped: no continuation


def _accounted(job: Job) -> None:
    """Back once accounting has the job's end: it hears of it a little after the queue."""
    deadline = time.monotonic() + 30
    while (slurm.accounting(job.id) or {}).get("state") != "COMPLETED":
        assert time.monotonic() < deadline, slurm.accounting(job.id)
        time.sleep(0.2)


def _usr1_to_the_batch_shell(job: Job) -> None:
    """USR1 to the job's batch shell only, which passes it on; back once the run saved and
    its script submitted the continuation."""
    subprocess.run(["scancel", "--batch", "--signal=USR1", job.id], check=True)
    deadline = time.monotonic() + 120
    while len(job.chain()) < 2:
        assert time.monotonic() < deadline, job.logs(err=True)[-2000:]
        time.sleep(0.2)


# The long chains (800 steps, 10 an epoch on the tiny set) evaluate and save every tenth epoch:
# every epoch, that took over half of a job's time (48 s, 24 of them evaluating: each
# evaluation starts its two loader workers again). What is tested, the stops, is unchanged.
EVERY_TEN_EPOCHS = ("train.eval_every_epochs=10", "checkpoint.every_epochs=10")


@pytest.mark.slurm
def test_usr1_to_the_batch_shell_or_the_steps_continues_the_run_whose_figures_add_up(
        slurm_cluster, home, tiny, run_cli, tmp_path):
    """A chain of three jobs: the first stopped by USR1 to its batch shell only (which passes
    it on), the second by USR1 to its steps. The summary and `hpctrain status` count the same
    restarts, the time and device-hours of all three jobs, and metrics.jsonl the steps just
    before each stop; `hpctrain runs` finds the run with its job chain and device-hours."""
    job = submit("default", tiny("run_name=chained", "data.num_workers=2",  # 11 s of steps
                                 "train.max_steps=800", "train.log_every=7", *EVERY_TEN_EPOCHS,
                                 "checkpoint.every_steps=100000"), gpus=1, time_limit="10")
    running(job)
    _usr1_to_the_batch_shell(job)
    running(job, records=3)
    slurm.cancel(job.chain()[1], signal="USR1")
    assert job.wait(timeout=400, poll=0.2) == "COMPLETED", job.logs(err=True)[-3000:]
    chain = job.chain()
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert len(chain) == 3 and summary["steps"] == 800
    assert summary["restarts"] == job.status()["restarts"] == 2
    err = job.logs(err=True)  # USR1 reached the workers and the resource tracker too
    assert "Traceback" not in err and "leak" not in err, err[-3000:]
    stops = stop_steps(job)
    records = [json.loads(line) for line in (job.run_dir / "metrics.jsonl").read_text()
               .splitlines()]
    assert len(stops) == 2 and set(stops) <= {r["step"] for r in records if r["kind"] == "train"}
    first, second, third = (elapsed(j) for j in chain)
    assert summary["wall_seconds"] > summary["job_seconds"] + first + second - 6
    assert summary["wall_seconds"] < first + second + third + 3
    assert summary["device_hours"] == pytest.approx(summary["wall_seconds"] / 3600)
    code, out, _ = run_cli("runs", "--json", "--db", str(tmp_path / "index.sqlite"))
    (row,) = [r for r in json.loads(out) if r["name"] == "chained"]
    assert code == 0 and row["jobs"] == chain and row["status"] == "completed"
    assert row["device_hours"] == summary["device_hours"] and row["steps"] == 800


def hpctrain_processes(marker: str) -> list[Path]:
    from slurm_cluster import python_processes

    return python_processes(marker)


def exited(marker: str, timeout: float = 60) -> None:
    """Wait until no `hpctrain run` with `marker` is left: a cancelled job is CANCELLED for
    Slurm at once, while its processes save and exit within KillWait."""
    deadline = time.monotonic() + timeout
    while hpctrain_processes(marker):
        assert time.monotonic() < deadline, f"a process with {marker} outlived {timeout} s"
        time.sleep(0.05)


def cancelled_until_exit(job, marker: str) -> float:
    """Cancel `job`; the seconds from the cancel until its `hpctrain run` (`marker`) exited:
    Slurm says CANCELLED at once, while the processes save and exit within KillWait."""
    cancelled = time.monotonic()
    slurm.cancel(job.id)
    assert job.wait(timeout=60, poll=0.5) == "CANCELLED"
    exited(marker)
    return time.monotonic() - cancelled


def listening(marker: str, timeout: float = 120) -> None:
    """Wait until the job's `hpctrain run` (its command line holds `marker`) takes SIGTERM:
    started, before its first step (importing torch alone takes seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in hpctrain_processes(marker):
            try:
                caught = next(line.split()[1] for line in (proc / "status").read_text()
                              .splitlines() if line.startswith("SigCgt"))
            except (OSError, StopIteration):
                continue
            if int(caught, 16) >> 14 & 1:  # SIGTERM is 15
                return
        time.sleep(0.02)
    raise AssertionError(f"no hpctrain run holding {marker} took SIGTERM")


@pytest.mark.slurm
def test_a_job_stopped_during_start_up_counts_in_every_figure_after_submit_resume(
        slurm_cluster, home, tiny, run_cli, tmp_path):
    """Three submissions of one run: cancelled mid-run; cancelled during start-up, before its
    first step (it saves nothing); continued to the end by `submit resume=DIR`. Before, the
    second vanished from the wall time and the restarts, and `status` (0 restarts: a new
    submission) disagreed with summary.json. Now summary.json, `hpctrain status` and the runs
    index agree on 2 restarts and the time of all three jobs."""
    base = ("train.max_steps=400", "train.log_every=5", "data.num_workers=0")
    first = submit("default", tiny("run_name=startup", *base), gpus=1, time_limit="10")
    marker = f"run_name={first.run_dir.name}"  # `submit resume=DIR` runs the same name
    running(first)
    graces = [cancelled_until_exit(first, marker)]  # then the second job's cancel cannot
    second = submit("default", tiny(f"resume={first.run_dir}", *base), gpus=1,  # find it
                    time_limit="10")
    listening(marker)
    graces.append(cancelled_until_exit(second, marker))
    assert "stopped during start-up" in second.logs(err=True)
    third = submit("default", tiny(f"resume={first.run_dir}", *base), gpus=1, time_limit="10")
    assert third.wait(timeout=300, poll=0.2) == "COMPLETED", third.logs(err=True)[-3000:]
    summary = json.loads((first.run_dir / "summary.json").read_text())
    starts = json.loads((first.run_dir / "run.json").read_text())["starts"]
    assert summary["steps"] == 400 and summary["restarts"] == 2
    assert third.status()["restarts"] == 2 and len(starts) == 3
    jobs = [elapsed(job.id) for job in (first, second, third)]
    # run.json's last job also counts its end after the summary (its last record)
    assert 0 <= sum(s["seconds"] for s in starts) - summary["wall_seconds"] < 2
    assert starts[1]["seconds"] > 0.5  # from the process's start to its stop
    # Slurm ends a cancelled job's time at the cancel, whole seconds; its processes go on
    # until they have saved and exited (`graces`), and hpctrain counts that time too
    assert sum(jobs) - 10 < summary["wall_seconds"] < sum(jobs) + sum(graces) + 3
    code, out, _ = run_cli("runs", "--json", "--db", str(tmp_path / "index.sqlite"))
    (row,) = [r for r in json.loads(out) if r["name"] == "startup"]
    assert row["jobs"] == [first.id, second.id, third.id]
    assert row["device_hours"] == summary["device_hours"]
    assert row["wall_seconds"] == summary["wall_seconds"]


def _saved_steps(run_dir: Path) -> list[int]:
    return [int(c.name.split("_")[1]) for c in list_checkpoints(run_dir / "checkpoints")]


def _train_records(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"]


def _kill_after_a_checkpoint(job: Job, marker: str, after: int) -> None:
    """SIGKILL to the run of `job` once it has saved past step `after` and logged two
    training records beyond that save."""
    deadline = time.monotonic() + 180
    while True:
        assert time.monotonic() < deadline, job.logs(err=True)[-2000:]
        saved = max(_saved_steps(job.run_dir), default=0)
        if saved > after and sum(r["step"] > saved for r in _train_records(job.run_dir)) >= 2:
            break
        time.sleep(0.05)
    for proc in hpctrain_processes(marker):
        subprocess.run(["kill", "-9", proc.name], check=False)


@pytest.mark.slurm
def test_goodput_explains_what_slurm_allocated_a_chain_stopped_once_and_killed_once(
        slurm_accounting_cluster, home, tiny, run_cli):
    """Three jobs of one run: the first stopped by USR1 (saved, continued in a new job), the
    second killed with SIGKILL after a checkpoint (no word, no save), the third submitted
    with resume=DIR to the end. `hpctrain goodput JOB` reads sacct's account of the chain:
    its allocated device-seconds are sacct's (to within its whole seconds); the run's own
    records explain all but the jobs' scripts and launches; the work lost to the kill is
    the steps redone at the median step time of the killed job's records after its last
    checkpoint (read here before the resume forgets them), to the last step it trained (its
    last record or its last beat, whichever is later); the queue gaps are sacct's. Once
    Slurm has forgotten the jobs, `hpctrain status` tells them from accounting."""
    base = ("data.num_workers=0", "train.max_steps=400", "train.log_every=5",
            "checkpoint.every_steps=60")
    first = submit("default", tiny("run_name=goodput", *base), gpus=1, time_limit="10")
    marker = f"run_name={first.run_dir.name}"
    running(first)
    _usr1_to_the_batch_shell(first)
    second = Job(first.chain()[1], first.run_dir)
    (stopped,) = stop_steps(first)
    _kill_after_a_checkpoint(second, marker, stopped)
    assert second.wait(timeout=60, poll=0.2) == "FAILED"
    resumed_from = max(_saved_steps(first.run_dir))
    killed = [r for r in _train_records(first.run_dir) if r["step"] > resumed_from]
    # the steps trained to the kill: its last record's, or the later beat progress.json kept
    # (none where the kill came within the watch's first look, 0.5 s: these jobs train 60
    # steps in under half a second; goodput then counts to the last record, as here)
    beat = RunDir(first.run_dir).read_progress() or {"step": 0}
    trained = max(killed[-1]["step"], beat["step"] or 0)
    redone = trained - resumed_from
    third = submit("default", tiny(f"resume={first.run_dir}", *base), gpus=1, time_limit="10")
    assert third.wait(timeout=300, poll=0.2) == "COMPLETED", third.logs(err=True)[-3000:]
    _accounted(third)
    code, out, err = run_cli("goodput", first.id, "--json")
    assert code == 0, err
    made = json.loads(out)
    ids = [first.id, second.id, third.id]
    runs = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(ids), "-o",
                           "JobID,ElapsedRaw"], capture_output=True, text=True, check=True)
    allocated = sum(int(line.split("|")[1]) for line in runs.stdout.split())
    assert made["source"] == "the scheduler's accounting" and made["jobs"] == 3
    assert made["scheduler_device_seconds"] == allocated
    # sacct counts whole seconds: each job's figure is within 1 s of the run's own
    assert abs(made["allocated_device_seconds"] - allocated) <= max(0.01 * allocated, len(ids))
    assert sum(made["device_seconds"].values()) == pytest.approx(
        made["allocated_device_seconds"])
    # each job's script, srun's launch and the interpreter's start before hpctrain's clock,
    # and sacct's whole seconds: under 2 s a job
    assert made["device_seconds"]["unrecorded"] < 2 * len(ids)
    assert made["redone_steps"] == redone > 0
    median = statistics.median(r["seconds_per_step"] for r in killed)
    assert made["device_seconds"]["lost_work"] == pytest.approx(redone * median, rel=0.02)
    gaps = [datetime.fromisoformat(slurm.job_details(later)[0]["StartTime"]) -
            datetime.fromisoformat(slurm.job_details(before)[0]["EndTime"])
            for before, later in zip(ids, ids[1:])]
    assert made["gaps_seconds"] == [g.total_seconds() for g in gaps]
    assert made["between_jobs_seconds"] == sum(made["gaps_seconds"])
    code, out, _ = run_cli("goodput", str(first.run_dir))
    assert code == 0 and "from the scheduler's accounting" in out
    assert "outside the run's records" in out
    assert f"the scheduler counts {allocated:,.1f} device-seconds for jobs " \
        f"{', '.join(sorted(ids))}" in out
    # once Slurm has forgotten the jobs (MinJobAge), `status` reads accounting too
    slurm_accounting_cluster.forget_jobs()
    code, out, _ = run_cli("status", third.id, "--json")
    status = json.loads(out)
    assert code == 0 and (status["state"], status["source"]) == ("COMPLETED", "sacct")
    assert status["exit_code"] == "0:0" and status["name"] == "goodput"
    code, out, _ = run_cli("status", second.id)  # the job killed: srun's 9, its signal
    assert code == 0 and re.search(r"^state\s+FAILED$", out, re.M) and "sacct" in out
    assert re.search(r"^exit_code\s+9:0$", out, re.M), out


@pytest.mark.slurm
def test_a_job_slurm_preempts_and_requeues_saves_in_its_grace_time_and_finishes(
        slurm_preemption_cluster, home, tiny):
    """PreemptMode=REQUEUE: Slurm sends SIGTERM to every process, SIGKILL KillWait (30 s)
    later, and requeues the job itself; the run saves in between and the requeued job
    resumes it (hpctrain's script does not continue it a second time)."""
    job = submit("default", tiny("run_name=preempted", "data.num_workers=2",  # 11 s of steps
                                 "train.max_steps=800", "train.log_every=7", *EVERY_TEN_EPOCHS),
                 gpus=1, time_limit="10")
    running(job)
    subprocess.run(["sbatch", "--parsable", "-p", "urgent", "--nodes=2", "--exclusive",
                    "-o", "/dev/null", "--wrap", "sleep 1"], check=True, capture_output=True)
    assert job.wait(timeout=400, poll=0.2) == "COMPLETED", job.logs(err=True)[-3000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    status = job.status()
    assert summary["steps"] == 800 and summary["restarts"] == status["restarts"] == 1
    assert job.chain() == [job.id]
    err = job.logs(err=True)
    assert "DUE TO PREEMPTION" in err and "SIGTERM received" in err
    assert float(re.search(r"saved ([\d.]+) s after the signal", err).group(1)) < 30
    assert "(resuming step_" in job.logs()


@pytest.mark.slurm
def test_status_of_an_unknown_job_says_why(slurm_cluster, home, run_cli):
    code, out, _ = run_cli("status", "999999", "--json")
    status = json.loads(out)
    assert code == 0 and status["state"] == "UNKNOWN"
    assert "no longer knows the job" in status["reason"]


def final_weights(run_dir: Path) -> dict:
    from hpctrain.train.checkpoints.checkpoint import read_checkpoint

    return read_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])["model"]


@pytest.mark.slurm
def test_a_preempted_job_and_a_hung_one_requeue_themselves_and_finish_like_an_uninterrupted_one(
        slurm_cluster, home, tiny, tmp_path, monkeypatch):
    """The hung job: a metric of the task (a hook of the user's, which changes no weight)
    never returns at its 30th call on one of the two ranks, once."""
    long_run = tiny("train.max_steps=60", "train.log_every=5", "checkpoint.every_steps=1000",
                    "checkpoint.keep_last=5", "data.num_workers=2")
    reference = submit("default", [*long_run, "run_name=straight"], gpus=2, nodes=2,
                       time_limit="10")
    monkeypatch.setenv("HANGS_STUCK_AT", "30")
    monkeypatch.setenv("HANGS_ONCE", str(tmp_path / "hung-once"))
    hooked = f"{Path(__file__).parent.parent / 'fixtures' / 'hangs.py'}:stuck_metric"
    hung = submit("default", [*long_run, "run_name=hung", f"task.metrics={{hit: {hooked}}}",
                              "checkpoint.every_steps=20", "monitor.hang_after=3"],
                  gpus=2, nodes=2, time_limit="10")
    preempted = submit("default", [*long_run, "run_name=preempted"], gpus=2, nodes=2,
                       time_limit="10")
    metrics = preempted.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text().count('"train"') >= 2):
        assert time.monotonic() < deadline and preempted.state in ("PENDING", "RUNNING")
        time.sleep(0.2)
    slurm.cancel(preempted.id, signal="USR1")  # what --signal=USR1@lead sends before the end
    assert reference.wait(timeout=300, poll=0.2) == "COMPLETED"
    assert preempted.wait(timeout=300, poll=0.2) == "COMPLETED", preempted.logs(err=True)[-3000:]
    summary = json.loads((preempted.run_dir / "summary.json").read_text())
    assert summary["steps"] == 60 and summary["restarts"] == 1
    first, second = preempted.chain()
    assert preempted.status()["chain"] == [first, second]
    stops = preempted.logs(err=True)
    assert "SIGUSR1 received" in stops and "The batch script continues it" in stops
    assert f"continuing in job {second} once job {first} ends" in stops
    assert "(resuming step_" in preempted.logs()
    # promptly: not after Slurm's 2-minute requeue delay
    ended = datetime.fromisoformat(slurm.job_details(first)[0]["EndTime"])
    started = datetime.fromisoformat(slurm.job_details(second)[0]["StartTime"])
    assert (started - ended).total_seconds() < 30
    ours, theirs = final_weights(preempted.run_dir), final_weights(reference.run_dir)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) <= 1e-5
    assert hung.wait(timeout=300, poll=0.2) == "COMPLETED", hung.logs(err=True)[-3000:]
    first, second = hung.chain()
    said = hung.logs(err=True)
    assert "hpctrain: hung in " in said and "in stuck_metric" in said
    assert f"continuing in job {second} once job {first} ends" in said
    record = json.loads((hung.run_dir / "run.json").read_text())
    assert "in stuck_metric" in record["starts"][0]["hung"] and "hung" not in \
        record["starts"][1]
    assert json.loads((hung.run_dir / "summary.json").read_text())["status"] == "completed"
    ours = final_weights(hung.run_dir)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) <= 1e-5


@pytest.mark.slurm
def test_a_sweep_is_one_array_job_with_a_run_directory_per_element(slurm_cluster, home,
                                                                   tmp_path, run_cli, tiny):
    code, out, err = run_cli("submit", "default", *tiny("run_name=lrs", "train.max_steps=3"),
                             "--gpus", "1", "--time", "10", "--sweep", "optim.lr=0.05,0.2",
                             "--sweep", "train.label_smoothing=0.0,0.1", "--json")
    assert code == 0, err
    job = Job(json.loads(out)["job_id"])
    assert job.wait(timeout=300, poll=0.2) == "COMPLETED", job.status()
    assert sorted(job.status()["elements"]) == ["0", "1", "2", "3"]
    sweep = tmp_path / "runs" / "lrs"
    seen = set()
    for index in range(4):
        config = (sweep / f"element-{index}" / "config.yaml").read_text()
        summary = json.loads((sweep / f"element-{index}" / "summary.json").read_text())
        assert summary["status"] == "completed"
        lr = "0.05" if "lr: 0.05" in config else "0.2"
        smoothing = "0.1" if "label_smoothing: 0.1" in config else "0.0"
        seen.add((lr, smoothing))
    assert seen == {("0.05", "0.0"), ("0.05", "0.1"), ("0.2", "0.0"), ("0.2", "0.1")}
    assert len(list(sweep.glob(f"slurm-{job.id}_*.out"))) == 4


@pytest.mark.slurm
def test_more_gpus_than_the_nodes_have_shows_slurms_own_message(slurm_cluster, home, tmp_path,
                                                                 run_cli, tiny, monkeypatch):
    """A profile that promises 8 GPUs per node, on nodes that have 4: sbatch refuses."""
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text("big:\n  gpus_per_node: 8\n  cpus_per_gpu: 1\n")
    monkeypatch.setenv("HPCTRAIN_CLUSTERS", str(profiles))
    code, _, err = run_cli("submit", "default", *tiny(), "--gpus", "8", "--time", "10",
                           "--cluster", "big")
    assert code == 2 and "sbatch --parsable failed" in err
    assert "Requested node configuration is not available" in err


@pytest.mark.slurm
def test_a_job_that_could_never_start_is_refused_with_the_fix(slurm_cluster, home, run_cli,
                                                              tiny):
    """The generic profile's 8 CPUs per GPU x 2 tasks on nodes of 8 CPUs: sbatch would accept
    it and leave it pending forever."""
    code, _, err = run_cli("submit", "default", *tiny(), "--gpus", "2", "--time", "10")
    assert code == 2 and "could never start: 2 task(s) per node x 8 CPUs" in err
    assert "largest node of the default partition has 8. Use --cpus-per-gpu 4" in err
    code, out, err = run_cli("submit", "default", *tiny(), "--gpus", "2", "--time", "10",
                             "--dry-run")  # a preview: the script, and the same words
    assert code == 0 and "#SBATCH --cpus-per-task=8" in out
    assert "warning: this job could never start" in err
    code, _, err = run_cli("submit", "default", *tiny(), "--gpus", "2", "--time", "10",
                           "--cpus-per-gpu", "4", "--dry-run")
    assert code == 0 and "warning" not in err


@pytest.mark.slurm
@pytest.mark.slow
def test_a_single_process_default_run_resumed_on_two_nodes_finishes_at_its_accuracy(
        slurm_cluster, home, tmp_path, default_shapes_cache, default_recipe_run):
    """2 nodes x 2 tasks, gloo on CPU: the README's default run, stopped after epoch 7 on one
    process, goes on as a submitted job over 4 processes on 2 nodes (the global batch, 128, is
    split 4 x 32) and ends as accurate as the uninterrupted single-process run."""
    _, single = default_recipe_run
    copy = tmp_path / "runs" / "default-2x2"
    shutil.copytree(Path(single["run_dir"]), copy)
    seventh_epoch = list_checkpoints(copy / "checkpoints")[1]
    assert read_meta(seventh_epoch)["step"] == 7 * single["steps"] // 8
    job = submit("default", [f"output_dir={tmp_path / 'runs'}", f"resume={seventh_epoch}",
                             f"data.shapes.cache_dir={default_shapes_cache}",
                             "tensorboard=false"], gpus=4, nodes=2, time_limit="30",
                 cpus_per_gpu=2)  # the emulated nodes have 8 CPUs, not the profile's 2 x 8
    assert job.wait(timeout=900, poll=0.2) == "COMPLETED", job.logs(err=True)[-3000:]
    summary = json.loads((copy / "summary.json").read_text())
    assert (summary["world_size"], summary["global_batch_size"]) == (4, 128)
    assert summary["steps"] == single["steps"]
    assert summary["best_val_accuracy"] >= 0.95, summary
    assert abs(summary["final_val_accuracy"] - single["final_val_accuracy"]) < 0.02


@pytest.mark.slurm
def test_logs_follow_prints_until_the_job_ends(slurm_cluster, home, run_cli, tiny):
    job = submit("default", tiny("run_name=followed"), gpus=1, time_limit="10")
    code, out, _ = run_cli("logs", job.id, "--follow")
    assert code == 0 and "hpctrain: run" in out and "best_val_accuracy" in out
    assert job.state == "COMPLETED"


@pytest.mark.slurm
def test_language_model_and_point_cloud_recipes_run_as_jobs(slurm_cluster, home, tmp_path):
    common = [f"output_dir={tmp_path / 'runs'}", "tensorboard=false", "data.num_workers=0",
              "train.max_steps=4", "train.log_every=2"]
    lm = submit("tiny-lm", [*common, "run_name=lm", f"data.arithmetic.cache_dir={tmp_path}",
                            "data.arithmetic.num_train=2000", "train.batch_size=8"],
                gpus=1, time_limit="10")
    points = submit("pointnet", [*common, "run_name=points", f"data.shapes3d.cache_dir={tmp_path}",
                                 "data.shapes3d.num_train=40", "data.shapes3d.num_val=10",
                                 "data.points.num_points=64", "train.batch_size=4"],
                    gpus=1, time_limit="10")
    for job, task in ((lm, "language_modeling"), (points, "point_cloud_classification")):
        assert job.wait(timeout=240, poll=0.2) == "COMPLETED", job.logs(err=True)[-3000:]
        summary = json.loads((job.run_dir / "summary.json").read_text())
        assert (summary["task"], summary["steps"], summary["launcher"]) == (task, 4, "slurm")


USER_MODEL = """
from torch import nn

def build(num_classes, width=4):
    return nn.Sequential(nn.Conv2d(3, width, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, num_classes))
"""


@pytest.mark.slurm
def test_a_job_trains_a_model_named_by_module_from_the_submit_directory(
        slurm_cluster, home, tmp_path, monkeypatch, tiny):
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "nets.py").write_text(USER_MODEL)
    monkeypatch.chdir(tmp_path)
    job = submit("default", tiny("run_name=usercode", "model.name=userpkg.nets:build",
                                 "train.max_steps=4"), gpus=1, time_limit="10")
    assert job.wait(timeout=240, poll=0.2) == "COMPLETED", job.logs(err=True)[-3000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and "userpkg.nets:build" in job.logs()


@pytest.mark.slurm
def test_a_job_submitted_with_autotune_tunes_on_its_gpus_once_and_trains_the_pick(
        slurm_cluster, home, tmp_path, tiny):
    """autotune in the batch shell, each trial an srun step of the job; the run trains
    tuned.yaml; the same script again (a continuation) finds the pick and does not tune."""
    job = submit("default", tiny("run_name=tuned", "train.max_steps=6"), gpus=1,
                 time_limit="10", autotune=[
                     "--budget", "30", "--warmup-steps", "2", "--measure-steps", "4",
                     "--no-confirm", "--fix", "compile", "--fix", "precision", "--fix",
                     "data.num_workers", "--fix", "train.grad_accum_steps"])
    assert job.wait(timeout=240, poll=0.2) == "COMPLETED", job.logs(err=True)[-3000:]
    tuned = job.run_dir / "autotune"
    trials = json.loads((tuned / "autotune.json").read_text())["trials"]
    assert all(t["status"] == "measured" for t in trials)  # then the run-off, if time left
    assert [t["settings"] for t in trials[:2]] == [[], ["channels_last=false"]]
    for trial in trials:
        start = json.loads((Path(trial["run_dir"]) / "run.json").read_text())["starts"][0]
        assert (start["launcher"], start["job_id"]) == ("slurm", job.id)
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 6
    assert "name: default-tuned" in (job.run_dir / "config.yaml").read_text()
    assert f"autotune default: {len(trials)} trials" in job.logs()
    written = (tuned / "autotune.json").stat().st_mtime
    again = Job(slurm.submit(job.run_dir / "job.sbatch"), job.run_dir)
    assert again.wait(timeout=120, poll=0.2) == "COMPLETED"
    assert (tuned / "autotune.json").stat().st_mtime == written
    assert "is already complete" in again.logs()
