"""`hpctrain tune --submit`: the search as one array job of the cluster's scheduler. Each
element runs a tune worker in its batch shell, which takes trials until the budget is spent
and runs each with the scheduler's launcher on the element's GPUs; an element stopped early (signal, time limit) continues in a new
job of the same index, which resumes its trial.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.errors import ConfigError
from hpctrain.tune.study import Search


def plan(folder: Path, search: Search, elements: int, gpus: int, time_limit: str,
         cluster: str | None, **options):
    """(request, script, profile) for the search's array job, checked as `hpctrain submit`
    checks a run: the layout, the user code, the places."""
    from hpctrain.cluster import jobs
    from hpctrain.cluster.profiles import get_profile
    from hpctrain.cluster.request import JobRequest
    from hpctrain.config import code_references, load_config

    if options.get("container"):
        raise ConfigError("--container with tune --submit: the worker would need the "
                          "scheduler's launcher inside the image; run the search with "
                          "--venv, --conda or --module instead")
    config = load_config(search.recipe, search.for_trials)
    name = options.pop("job_name", None) or folder.name
    jobs.check_places(name, options)
    references = code_references(config)
    if references:
        jobs.check_user_code(references, options.get("venv"))
    profile = get_profile(cluster)
    jobs.check_model_layout(config, gpus, options.get("nodes"), profile)
    request = JobRequest(gpus=gpus, time=time_limit, run_dir=folder, recipe=search.recipe,
                         job_name=name, worker=["tune", "worker", str(folder)],
                         elements=elements, workdir=Path.cwd(), user_code=bool(references),
                         **options)
    return request, jobs.scheduler_of(profile).script(request, profile), profile


def submit(folder: Path, search: Search, elements: int, gpus: int, time_limit: str,
           cluster: str | None = None, **options):
    from hpctrain.cluster import jobs

    request, script, profile = plan(folder, search, elements, gpus, time_limit, cluster,
                                    **options)
    return jobs.send(request, script, profile)
