"""How often to checkpoint, from what a checkpoint costs and how often a run is stopped
without a word (issue 55, item 3).

Between two checkpoints `interval` seconds of training apart, a save blocks the training for
`save` seconds; a stop that gives no warning (a node lost, the OOM killer, kill -9; a time
limit's stop signal saves where it lands and costs nothing) loses the training since the last
checkpoint, on average half an interval, and a restart. Young (1974) minimised the expected
waste of the two, `save / interval + interval / (2 * mtbf)`, at sqrt(2 * save * mtbf); Daly
(2006) refined it for saves that are not small against the mean time between stops. The
interval is never shorter than a save itself (a run would do nothing else).
"""

from __future__ import annotations

import math


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """The training seconds between checkpoints that waste the least, by Daly's higher-order
    formula (Young's sqrt(2 * save * mtbf), corrected); mtbf: the mean time between
    unwarned stops. For saves of half the mean time between stops or more, the mean time
    itself (Daly's bound)."""
    if save_seconds <= 0:
        raise ValueError(f"a save of {save_seconds} s: a save takes some time")
    if save_seconds >= mtbf_seconds / 2:
        return mtbf_seconds
    ratio = save_seconds / (2 * mtbf_seconds)
    best = math.sqrt(2 * save_seconds * mtbf_seconds) * (
        1 + math.sqrt(ratio) / 3 + ratio / 9) - save_seconds
    return max(best, save_seconds)


def expected_waste(interval: float, save_seconds: float, mtbf_seconds: float,
                   restart_seconds: float = 0.0) -> float:
    """Young's first-order estimate of the share of a run's time wasted at `interval`: the
    saves, and per unwarned stop half an interval of training redone and a restart."""
    return save_seconds / interval + (interval / 2 + restart_seconds) / mtbf_seconds
