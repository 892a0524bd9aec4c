"""The environment of a Slurm step as its tasks see it, and the layout hpctrain reads from it."""

from hpctrain.cluster.environment import detect


def layout(world: int, local_world: int | None = None, launcher="torchrun"):
    local_world = local_world or world
    return detect({"RANK": "0", "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
                   "LOCAL_WORLD_SIZE": str(local_world)}) if launcher == "torchrun" else \
        detect({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": str(world),
                "SLURM_STEP_TASKS_PER_NODE": str(local_world), "SLURM_STEP_NODELIST": "n1"})


SLURM_STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
              "SLURM_PROCID": "1", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "n1"}
