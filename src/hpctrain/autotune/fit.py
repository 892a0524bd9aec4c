"""Whether a candidate fits, from `hpctrain memory`'s prediction, before it costs a trial.

On a GPU the capacity is the card's; on a CPU, the memory this machine has available now
(monitor/host_memory.py), shared by the run's processes. A candidate the prediction cannot
tell (a model it cannot trace) is run, and why the prediction could not tell is kept with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.config import Config
from hpctrain.units import fmt_bytes


@dataclass(frozen=True)
class Prediction:
    misfit: str | None = None  # why it does not fit; None: it fits, or see `untold`
    untold: str | None = None  # why the prediction could not tell


def cannot_trace() -> tuple[type[BaseException], ...]:
    """What `hpctrain memory`'s fake-tensor step raises for a model it cannot run: the model
    is the user's, so these are said with the candidate, not a failure of autotune."""
    from hpctrain.errors import UserError

    return (UserError, RuntimeError, ValueError, NotImplementedError)


def untold(err: BaseException) -> str:
    """Why the prediction could not tell, in one line."""
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}" if str(err) else \
        type(err).__name__


def predict_fit(config: Config, processes: int = 1) -> Prediction:
    """Whether `config` fits this machine's device, by the prediction."""
    from hpctrain.memory.estimate import estimate, resolve_target
    from hpctrain.monitor.host_memory import room
    from hpctrain.train.hardware.system import resolve_device

    on_cpu = resolve_device(config.device).type == "cpu"
    left = room() if on_cpu else None
    if on_cpu and left is None:
        return Prediction(untold="this machine's available memory cannot be read")
    capacity = f"{left.bytes // processes}B" if on_cpu else None
    try:
        where = config.model_copy(update={"device": "cpu"}) if on_cpu else config
        found = estimate(where, resolve_target(where, capacity, processes))
    except cannot_trace() as err:
        return Prediction(untold=untold(err))
    if found.fits:
        return Prediction()
    source = left.bound if on_cpu else found.target.capacity_source
    return Prediction(f"predicted {fmt_bytes(found.in_use)} of "
                      f"{fmt_bytes(found.target.capacity)} ({source})")
