"""CPU package energy from RAPL (Linux powercap: /sys/class/powercap/intel-rapl:N, also used
for AMD's RAPL): the fallback when a run has no GPU to ask.

Each package domain counts microjoules in `energy_uj` and wraps at `max_energy_range_uj`; a
reading taken at least once per wrap period (minutes at full load) sees every wrap. Since
2020 most kernels let only root read `energy_uj`: then RAPL is "not readable" and the run's
energy is not measured, never guessed. The figure is the node's packages, shared by every
process on it: ranks on one node count it once (the meter's device key is the host).
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.readers import read_text_capped

POWERCAP = Path("/sys/class/powercap")


class RaplPackages:
    """The package domains' energy since `start()`, summed, in joules."""

    def __init__(self, domains: list[Path]):
        self.domains = domains
        self.last = [self._counter(d) for d in domains]
        self.ranges = [int(read_text_capped(d / "max_energy_range_uj")) for d in domains]
        self.total_uj = 0

    @staticmethod
    def _counter(domain: Path) -> int:
        return int(read_text_capped(domain / "energy_uj"))

    def energy_joules(self) -> float:
        """Joules since this object was made (every wrap seen since the last call counted)."""
        for i, domain in enumerate(self.domains):
            now = self._counter(domain)
            step = now - self.last[i]
            self.total_uj += step if step >= 0 else step + self.ranges[i]
            self.last[i] = now
        return self.total_uj / 1e6


def open_rapl(root: Path = POWERCAP) -> RaplPackages | str:
    """The CPU packages' counters, or why they cannot be read (a sentence)."""
    domains = sorted(d for d in root.glob("intel-rapl:*")
                     if d.name.count(":") == 1 and _name(d).startswith("package"))
    if not domains:
        return f"no RAPL package domains under {root}"
    try:
        return RaplPackages(domains)
    except PermissionError:
        return f"RAPL counters under {root} are readable by root only"
    except (OSError, ValueError) as err:
        return f"RAPL counters under {root} cannot be read ({err})"


def _name(domain: Path) -> str:
    try:
        return read_text_capped(domain / "name").strip()
    except (OSError, ValueError):
        return ""
