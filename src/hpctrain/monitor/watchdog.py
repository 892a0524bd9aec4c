"""One line when the GPUs idle: utilisation under a threshold for several logging intervals
in a row, with the likely cause and the command that measures it. Said once per low spell."""

from __future__ import annotations


class Watchdog:
    def __init__(self, threshold: float, intervals: int, recipe: str):
        self.threshold, self.intervals, self.recipe = threshold, intervals, recipe
        self.low = 0

    def observe(self, utilization: float | None, data_wait: float) -> str | None:
        """The warning line when this interval completes a low spell, else None."""
        if utilization is None or utilization >= self.threshold:
            self.low = 0
            return None
        self.low += 1
        if self.low != self.intervals:
            return None
        head = (f"hpctrain: GPU utilisation {utilization:.0%} (under "
                f"{self.threshold:.0%} for {self.intervals} logging intervals): ")
        if data_wait >= 0.2:
            return head + (f"input-bound, the step waits for data {data_wait:.0%} of the time. "
                           f"Measure the input pipeline with: hpctrain bench data {self.recipe}")
        return head + (f"not the input (data wait {data_wait:.0%}); small kernels, host work or "
                       f"communication. See where the time goes with: hpctrain profile "
                       f"{self.recipe}")
