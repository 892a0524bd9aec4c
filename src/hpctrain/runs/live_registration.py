"""A run's row in a team's PostgreSQL index, kept live by the run itself: written at the start,
its heartbeat beaten every minute, rewritten at the end from the run directory. So the team
sees runs as they go, and a run killed without a word as lost (its heartbeat stops).

The index is a convenience, never a reason to stop training: a database that cannot be
reached is said once, and the run goes on (`hpctrain runs --db URL` picks it up later from
the run directory). An SQLite index needs no registration: it is filled by scanning.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hpctrain.runs.database import POSTGRES, open_database
from hpctrain.runs.index import Index
from hpctrain.runs.scan import scan_run


class Registration:
    def __init__(self, url: str, run_dir: Path):
        self.url, self.run_dir = url, run_dir
        self.index, self.run_id = None, None

    def _quietly(self, what: str, action) -> None:
        try:
            action()
        except Exception as err:  # any driver or server error: the run goes on
            print(f"hpctrain: warning: the runs index {self.url.split('@')[-1]}: cannot "
                  f"{what} ({str(err).strip().splitlines()[-1] if str(err).strip() else err})"
                  "; training goes on, and hpctrain runs --db reads the run directory later",
                  file=sys.stderr, flush=True)
            self.index = None

    def start(self) -> Registration:
        def register():
            self.index = Index(open_database(self.url))
            row, evals = scan_run(self.run_dir)
            self.run_id = row["run_id"]
            self.index.put({**row, "heartbeat": time.time()}, evals)
        self._quietly("register this run", register)
        return self

    def beat(self) -> None:
        if self.index is not None:
            self._quietly("beat the heartbeat", self._beat)

    def _beat(self) -> None:
        self.index.db.execute("UPDATE runs SET heartbeat = ? WHERE run_id = ?",
                              (time.time(), self.run_id))
        self.index.db.commit()

    def finish(self) -> None:
        """The run's final row, from its run directory (summary.json written)."""
        if self.index is None:
            return
        self._quietly("record the end of this run",
                      lambda: self.index.put(*scan_run(self.run_dir)))
        if self.index is not None:
            self.index.db.close()


def register(url: str | None, run_dir: Path) -> Registration | None:
    """The live registration for a PostgreSQL `url` (HPCTRAIN_DB), else None."""
    if not url or not url.startswith(POSTGRES):
        return None
    return Registration(url, run_dir).start()
