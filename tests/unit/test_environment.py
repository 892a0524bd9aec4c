"""The process layout read from the launchers' variables, and the checks made before any
process group starts.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_environment.py."""


import pytest
import torch

from hpctrain.cluster.environment import detect
from hpctrain.cluster.slurm import expand_hostlist, job_end_time, port_for_job, tasks_per_node
from hpctrain.config import load_config
from hpctrain.errors import ConfigError, DeviceError
from hpctrain.parallel import processes as parallel
from hpctrain.parallel.layout import Layout, resolve_layout
from step_layouts import SLURM_STEP, layout


def test_host_lists_expand_like_slurm():
    assert expand_hostlist("n[1-2]") == ["n1", "n2"]
    assert expand_hostlist("gpu[08-10,13],login1") == ["gpu08", "gpu09", "gpu10", "gpu13",
                                                       "login1"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_hostlist("jean-zay-iam01") == ["jean-zay-iam01"]


def test_task_layouts():
    assert tasks_per_node("2(x2)") == [2, 2]
    assert tasks_per_node("4(x2),3") == [4, 4, 3]
    with pytest.raises(ConfigError, match="cannot read"):
        tasks_per_node("two")


def test_single_process_also_inside_a_batch_script():
    """The batch step of a job has SLURM_PROCID and SLURM_NTASKS but is not an srun step."""
    env = detect({"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "4",
                  "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert env.launcher == "single" and env.world_size == 1 and env.job_id == "77"


def test_torchrun_variables_win_even_inside_a_slurm_job():
    env = detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                  "GROUP_RANK": "0", "MASTER_ADDR": "node7", "MASTER_PORT": "29400",
                  "SLURM_JOB_ID": "12", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"})
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("torchrun", 3, 8, 1)
    assert (env.local_world_size, env.num_nodes, env.master_addr) == (4, 2, "node7")
    assert env.master_port == 29400 and env.job_id == "12"


def test_srun_step_derives_address_and_port_without_scontrol():
    step = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]"}
    env = detect(step)
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("slurm", 3, 4, 1)
    assert (env.local_world_size, env.num_nodes, env.node_rank) == (2, 2, 1)
    assert env.master_addr == "gpu07" and env.master_port == port_for_job("4242")
    assert detect({**step, "SLURM_PROCID": "0"}).master_port == env.master_port  # all agree


def test_unequal_tasks_per_node_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="--ntasks-per-node"):
        detect({"SLURM_JOB_ID": "5", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "7",
                "SLURM_STEP_TASKS_PER_NODE": "4,3", "SLURM_STEP_NODELIST": "n[1-2]"})


def test_global_batch_splits_or_says_what_divides():
    config = load_config("default", ["train.global_batch_size=96", "train.grad_accum_steps=2"])
    assert parallel.per_device_batch(config, 4) == (12, 96)
    with pytest.raises(ConfigError, match=r"does not divide among 5 process.*multiple of 10"):
        parallel.per_device_batch(config, 5)
    plain = load_config("default", ["train.batch_size=16"])
    assert parallel.per_device_batch(plain, 4) == (16, 64)


def test_strategy_choice_and_refusals():
    assert resolve_layout(load_config("default", []), layout(1)).strategy == "none"
    assert resolve_layout(load_config("default", []), layout(2)).strategy == "ddp"
    fsdp = load_config("default", ["parallel.strategy=fsdp"])
    assert resolve_layout(fsdp, layout(1)).strategy == "none"  # nothing to shard over
    with pytest.raises(ConfigError, match="each would train its own copy"):
        resolve_layout(load_config("default", ["parallel.strategy=none"]), layout(2))
    cpu = torch.device("cpu")
    ddp, sharded = Layout(2, strategy="ddp"), Layout(2, strategy="fsdp")
    with pytest.raises(ConfigError, match="sync_batchnorm"):
        parallel.check_layout(load_config("default", ["parallel.sync_batchnorm=true"]), ddp,
                              cpu, "fp32")
    with pytest.raises(ConfigError, match="nothing to offload"):
        parallel.check_layout(load_config("default", ["parallel.cpu_offload=true"]), sharded,
                              cpu, "fp32")
    with pytest.raises(ConfigError, match="precision=bf16"):
        parallel.check_layout(load_config("default", []), sharded, cpu, "fp16")
    with pytest.raises(ConfigError, match="nccl needs GPUs"):
        parallel.check_layout(load_config("default", ["parallel.backend=nccl"]), ddp, cpu,
                              "fp32")
    with pytest.raises(ConfigError, match="static_graph.*grad_accum_steps"):
        parallel.check_layout(load_config("default", ["parallel.static_graph=true",
                                                      "train.grad_accum_steps=2"]), ddp,
                              cpu, "fp32")


def test_more_ranks_per_node_than_gpus_is_refused(monkeypatch):
    """CUDA cannot run here: pretend a node with 2 GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parallel.local_device("auto", layout(2)) == "cuda:0"
    with pytest.raises(DeviceError, match=r"4 processes on .* only 2 GPU\(s\)"):
        parallel.local_device("auto", layout(4))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert parallel.local_device("auto", layout(4, launcher="slurm")) == "cuda:0"  # bound


def test_job_end_time_from_the_environment():
    assert job_end_time("9", {"SLURM_JOB_END_TIME": "1900000000"}) == 1900000000.0


def test_restarts_count_slurm_requeues_and_continuations_in_new_jobs():
    assert detect({}).restart_count == 0
    assert detect({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1",
                   "HPCTRAIN_RESTARTS": "2"}).restart_count == 3


@pytest.mark.parametrize("name, value", [("SLURM_RESTART_COUNT", "abc"),
                                         ("SLURM_PROCID", "0x1"), ("MASTER_PORT", "")])
def test_a_launcher_variable_that_is_not_a_number_is_named(name, value):
    step = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1",
            "SLURM_STEP_NODELIST": "n1", name: value}
    if not value.strip():  # empty: as if unset
        assert detect(step).master_port == port_for_job("4242")
        return
    with pytest.raises(ConfigError, match=rf"{name}='{value}' is not a whole number"):
        detect(step)


def test_a_slurm_variable_that_is_not_a_number_stops_a_run_in_one_line(
        monkeypatch, run_cli, tiny):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "abc")
    code, _, err = run_cli("run", "default", *tiny())
    assert code == 2 and "SLURM_RESTART_COUNT='abc' is not a whole number" in err
    assert err.count("error:") == 1 and "Traceback" not in err


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


@pytest.mark.parametrize("launcher, change, words", [
    (SLURM_STEP, {"SLURM_PROCID": "5"}, "SLURM_PROCID=5 but SLURM_STEP_NUM_TASKS=2"),
    (SLURM_STEP, {"SLURM_STEP_NUM_TASKS": "0"}, "SLURM_STEP_NUM_TASKS='0' is not a whole "
                                                "number from 1 to 1,048,576"),
    (SLURM_STEP, {"SLURM_STEP_NUM_TASKS": "-1"}, "SLURM_STEP_NUM_TASKS='-1' is not"),
    (SLURM_STEP, {"SLURM_PROCID": "-1"}, "SLURM_PROCID='-1' is not a whole number from 0"),
    (SLURM_STEP, {"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 but the tasks per node=2"),
    (SLURM_STEP, {"SLURM_STEP_TASKS_PER_NODE": "1(x3)"}, "add up to 3"),
    (SLURM_STEP, {"SLURM_RESTART_COUNT": "-5"}, "SLURM_RESTART_COUNT='-5' is not a whole "
                                                "number from 0 to 1,000,000"),
    (SLURM_STEP, {"SLURM_RESTART_COUNT": "1" + "0" * 30},
     "SLURM_RESTART_COUNT='10000000000000000...' is not"),
    (SLURM_STEP, {"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a whole number from 1 "
                                           "to 65,535"),
    (TORCHRUN, {"RANK": "2"}, "RANK=2 but WORLD_SIZE=2"),
    (TORCHRUN, {"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not"),
    (TORCHRUN, {"RANK": "-1"}, "RANK='-1' is not"),
    (TORCHRUN, {"LOCAL_RANK": "3"}, "LOCAL_RANK=3 but LOCAL_WORLD_SIZE=2"),
    (TORCHRUN, {"LOCAL_WORLD_SIZE": "4"}, "LOCAL_WORLD_SIZE=4 but WORLD_SIZE=2"),
    (TORCHRUN, {"GROUP_RANK": "1"}, "GROUP_RANK=1 but WORLD_SIZE / LOCAL_WORLD_SIZE"),
    (TORCHRUN, {"HPCTRAIN_RESTARTS": "-1"}, "HPCTRAIN_RESTARTS='-1' is not"),
])
def test_launcher_variables_that_cannot_be_a_process_of_the_run_are_named(launcher, change,
                                                                          words):
    """Checked before any process group (issue 51): a rank past the process count waited in
    the rendezvous forever, a count of 0 or a rank of -1 failed inside torch.distributed,
    and a restart count of -5 or 10^30 was taken."""
    assert detect(launcher).world_size == 2  # the variables as a launcher sets them
    with pytest.raises(ConfigError) as refused:
        detect({**launcher, **change})
    assert words in str(refused.value) and "\n" not in str(refused.value)
