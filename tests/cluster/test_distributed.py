"""Real multi-process runs on gloo: torchrun workers (and, for the timeout, plain processes)
training the same recipe as one process, resharded checkpoints, preemption by signal."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp

from conftest import write_image_folder
from launching import launch, one_thread_env, records, run_ok, wait_for_step, worker_pid
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.sampling import EpochSampler
from hpctrain.models.small import tiny_cnn
from hpctrain.runs.directory import list_checkpoints

pytestmark = pytest.mark.distributed

# GroupNorm: its output does not depend on the batch, so N x b must equal 1 x N*b (BatchNorm
# would normalise per rank). fp32 on CPU; the tolerance is for the order of float sums.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def common(tmp_path_factory, shapes_cache):
    out = tmp_path_factory.mktemp("dist")
    return out, [
        f"output_dir={out / 'runs'}", f"data.shapes.cache_dir={shapes_cache}",
        "data.shapes.num_train=160", "data.shapes.num_val=41", "data.shapes.image_size=16",
        "data.images.image_size=16", "data.num_workers=0", "model.name=hpctrain:tiny_cnn",
        "model.kwargs.norm=group", "train.log_every=1", "tensorboard=false",
        "precision=fp32", "optim.lr=0.05", "train.max_steps=20", "train.eval_every_epochs=1",
        "train.global_batch_size=32",
    ]


def weights(checkpoint: Path) -> dict:
    state = {"model": tiny_cnn(10, norm="group").state_dict()}
    dcp.load(state, checkpoint_id=checkpoint)
    return state["model"]


def max_difference(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def one_process(common):
    """The reference: one process, 32 samples per step."""
    _, overrides = common
    return run_ok(1, [*overrides, "run_name=one"])


@pytest.fixture(scope="module")
def two_processes(common):
    """`two_processes(strategy)`: the run directory of a 2-process run (made once per
    strategy; the fsdp run writes its checkpoints asynchronously)."""
    _, overrides = common
    made = {}

    def run(strategy: str) -> Path:
        if strategy not in made:
            made[strategy] = run_ok(2, [
                *overrides, f"run_name=two-{strategy}", f"parallel.strategy={strategy}",
                "checkpoint.every_steps=5", "checkpoint.keep_last=10",
                f"checkpoint.async_save={strategy == 'fsdp'}"])
        return made[strategy]
    return run


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_follow_one_process_step_by_step(one_process, two_processes, strategy):
    two = two_processes(strategy)
    reference, ours = records(one_process, "train"), records(two, "train")
    assert [r["step"] for r in ours] == list(range(1, 21))
    for a, b in zip(reference, ours):
        assert abs(a["loss"] - b["loss"]) <= TOLERANCE, f"step {a['step']}"
        assert a["train_accuracy"] == b["train_accuracy"]
    # 41 validation samples over 2 ranks: each counted once, so the accuracies are equal
    assert [r["val_accuracy"] for r in records(one_process, "eval")] == \
        [r["val_accuracy"] for r in records(two, "eval")]
    # the recipe's channels_last: kept by DDP; FSDP shards it off and the run records why
    system = json.loads((two / "summary.json").read_text())["system"]
    assert (system["channels_last"], bool(system["note"])) == (strategy == "ddp",
                                                               strategy == "fsdp")
    summary = json.loads((two / "summary.json").read_text())
    assert (summary["world_size"], summary["strategy"]) == (2, strategy)
    assert (summary["global_batch_size"], summary["batch_size_per_device"]) == (32, 16)
    assert summary["straggler"]["rank"] in (0, 1) and summary["straggler"]["host"]
    assert len(ours[-1]["rank_step_seconds"]) == 2
    assert sorted(p.name for p in (two / "checkpoints" / "step_00000020").glob("rng_*")) == \
        ["rng_rank0.pt", "rng_rank1.pt"]


def test_accumulation_over_two_processes_equals_one_big_batch(common, one_process):
    _, overrides = common
    accumulated = run_ok(2, [*overrides, "run_name=accumulated", "train.global_batch_size=null",
                             "train.batch_size=8", "train.grad_accum_steps=2"])
    for a, b in zip(records(one_process, "train"), records(accumulated, "train"), strict=True):
        assert abs(a["loss"] - b["loss"]) <= TOLERANCE, f"step {a['step']}"
    assert json.loads((accumulated / "summary.json").read_text())["global_batch_size"] == 32


def test_validation_shards_cover_every_sample_once():
    for world in (1, 2, 3, 4):
        ranks = [EpochSampler(41, 16, shuffle=False, rank=r, world_size=world, pad=True)
                 for r in range(world)]
        assert len({len(s) for s in ranks}) == 1  # the same number of batches on every rank
        counted = [key.index for s in ranks for key in list(s)[:s.real_count]]
        assert sorted(counted) == list(range(41))


@pytest.mark.parametrize("nproc", [1])
def test_checkpoint_saved_on_two_processes_resumes_on_another_count(common, two_processes,
                                                                    nproc):
    """FSDP shards saved by 2 ranks, read back by 1 rank: the continued run ends where the
    uninterrupted 2-process run ended (within TOLERANCE; float sums differ in order). Onto more
    ranks: test_model_parallel's 2 x 2 mesh resumed on FSDP over 4."""
    out, overrides = common
    full = two_processes("fsdp")
    resumed = out / "runs" / f"resumed-on-{nproc}"
    shutil.copytree(full, resumed)
    for path in list_checkpoints(resumed / "checkpoints"):
        if int(path.name.split("_")[1]) > 10:
            shutil.rmtree(path)
    run_ok(nproc, [*overrides, f"run_name=resumed-on-{nproc}", "resume=auto",
                   "checkpoint.every_steps=5"])
    difference = max_difference(weights(full / "checkpoints" / "step_00000020"),
                                weights(resumed / "checkpoints" / "step_00000020"))
    assert difference <= TOLERANCE
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["world_size"] == nproc
    steps = [r["step"] for r in records(resumed, "train")]
    assert steps == list(range(1, 21))  # each step logged once, though 11-20 ran twice


def test_resuming_with_another_global_batch_says_how_to_keep_it(common, two_processes):
    _, overrides = common
    full = two_processes("ddp")
    done = launch(1, [*overrides, f"resume={full}", "train.global_batch_size=16"])
    assert done.returncode == 2
    assert "global batch of 32" in done.stderr and "train.global_batch_size=32" in done.stderr


def test_two_ranks_on_a_node_share_one_cached_pack(common, tmp_path):
    """data.images.cache: local rank 0 copies, rank 1 waits at the barrier and reuses the copy."""
    out, overrides = common
    source = write_image_folder(tmp_path / "images" / "train", per_class=32, size=16)
    write_image_folder(tmp_path / "images" / "val", per_class=8, size=16)
    pack(source.parent, tmp_path / "packed", PackOptions(shard_bytes=8000), workers=1,
         log=lambda *_: None)
    done = launch(2, [*overrides, "run_name=cached", "data.dataset=shards",
                      f"data.path={tmp_path / 'packed'}", f"data.images.cache={tmp_path / 'local'}",
                      "train.max_steps=4"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("data.images.cache: copying") == 1
    assert done.stderr.count("data.images.cache: reusing") == 1
    cached = tmp_path / "local" / "hpctrain-cache"
    assert len(list(cached.iterdir())) == 1 and not list(cached.glob(".*partial*"))
    summary = json.loads((out / "runs" / "cached" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2


def test_a_global_batch_that_does_not_divide_fails_before_starting(common):
    _, overrides = common
    done = launch(3, [*overrides, "run_name=three"])
    assert done.returncode != 0
    assert "does not divide among 3 process(es)" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr.split("does not divide")[0][-2000:]


def test_a_signal_to_one_rank_saves_on_every_rank_and_resumes_exactly(common):
    out, overrides = common
    steps = 50  # the signal comes at step 3 and stops the run within two steps
    long_run = [*overrides, f"train.max_steps={steps}", "checkpoint.every_steps=1000"]
    reference = run_ok(2, [*long_run, "run_name=uninterrupted"])
    run = out / "runs" / "signalled"
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "hpctrain", "run", "default", *long_run, "run_name=signalled"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=one_thread_env())
    rank1 = worker_pid(agent.pid, 1)
    wait_for_step(run, 3, agent)
    os.kill(rank1, signal.SIGUSR1)
    logged_at_signal = max(r["step"] for r in records(run, "train"))
    output, _ = agent.communicate(timeout=120)
    assert "exitcode  : 75" in output or "exitcode: 75" in output, output[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "preempted"
    stopped = summary["steps"]
    assert logged_at_signal <= stopped <= logged_at_signal + 2 and stopped < steps
    saved = list_checkpoints(run / "checkpoints")
    assert [p.name for p in saved] == [f"step_{stopped:08d}"]  # the stop saved, nothing else
    assert {p.name for p in saved[0].glob("rng_*")} == {"rng_rank0.pt", "rng_rank1.pt"}

    run_ok(2, [*long_run, "run_name=signalled", "resume=auto"])
    final = json.loads((run / "summary.json").read_text())
    assert final["status"] == "completed" and final["steps"] == steps and final["restarts"] == 1
    last = f"step_{steps:08d}"
    assert max_difference(weights(reference / "checkpoints" / last),
                          weights(run / "checkpoints" / last)) <= TOLERANCE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_hung_rank_gives_a_timeout_naming_rank_host_and_step(common):
    """Two processes started by hand (as torchrun would): rank 1 freezes (SIGSTOP) and rank
    0's next collective times out after parallel.timeout_seconds."""
    out, overrides = common
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = one_thread_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                             LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=str(port))
        ranks.append(subprocess.Popen(
            [sys.executable, "-m", "hpctrain", "run", "default", *overrides, "run_name=hung",
             "train.max_steps=100000", "parallel.timeout_seconds=5"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    try:
        wait_for_step(out / "runs" / "hung", 3, ranks[0])
        os.kill(ranks[1].pid, signal.SIGSTOP)
        _, err = ranks[0].communicate(timeout=120)
        assert ranks[0].returncode == 1
        assert f"rank 0 on {socket.gethostname()}: a collective failed at step" in err
        assert "parallel.timeout_seconds=5" in err and "Traceback" not in err
    finally:
        for process in ranks:
            process.kill()
            process.communicate()
