"""The runs index: one row per run (what MLflow keeps of a run, plus the configuration's hash,
the git commit, user, cluster, Slurm job chain, GPUs, device-hours, energy, best metric and
status) and one row per evaluation figure, in SQLite or PostgreSQL (database.py).

The run directories stay the truth. `refresh` scans output directories and rereads only the
runs whose files changed since (their sizes and times, `scan.signature`). A run renames
run.json into its folder at every start and summary.json at its end, and touches the folder
holding it then (directory.mark_changed): so a folder of runs whose time is unchanged since
the last refresh listed it holds the same runs, and its finished ones are not looked at (a
hundred thousand finished runs cost the index's rows and a stat per folder of runs); in a
folder that changed, a finished run whose own folder is unchanged costs one stat, any other
run a few. Runs an older hpctrain restarted did not touch their folder: `--rescan` rereads
every run's files. A run is keyed by its run.json's `run_id`: a folder
moved elsewhere updates its row's path instead of adding one. A row whose folder is gone is
marked "missing" (kept: its GPU-hours were spent).

"running" is stored; "lost" is read: a running run whose heartbeat (run.json, metrics.jsonl)
is older than LOST_AFTER_SECONDS, so a run killed without a word shows as lost without anyone
writing it down.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import ConfigError
from hpctrain.runs.database import Database
from hpctrain.runs.scan import FINAL, LOST_AFTER_SECONDS, candidate_dirs, scan_run, signature

COLUMNS = {
    "run_id": "TEXT PRIMARY KEY", "path": "TEXT", "name": "TEXT", "recipe": "TEXT",
    "status": "TEXT", "problem": "TEXT", "user_name": "TEXT", "host": "TEXT",
    "cluster": "TEXT", "started": "DOUBLE PRECISION", "ended": "DOUBLE PRECISION",
    "month": "TEXT", "config_hash": "TEXT", "git_commit": "TEXT", "jobs": "TEXT",
    "gpu_model": "TEXT", "gpu_count": "INTEGER", "world_size": "INTEGER",
    "device_hours": "DOUBLE PRECISION", "energy_joules": "DOUBLE PRECISION",
    "productive_hours": "DOUBLE PRECISION", "goodput": "DOUBLE PRECISION",
    "energy_source": "TEXT", "best_metric": "TEXT", "best_value": "DOUBLE PRECISION",
    "steps": "INTEGER", "wall_seconds": "DOUBLE PRECISION", "heartbeat": "DOUBLE PRECISION",
    "signature": "TEXT", "folder_mtime": "DOUBLE PRECISION", "summary": "TEXT",
    "config": "TEXT",
}
EVAL_COLUMNS = ("run_id", "step", "metric", "value", "elapsed_seconds", "device_hours",
                "energy_joules")
SCHEMA_VERSION = 3  # raise it with any change of the tables below
# An index's mark: a table of that name (both dialects) and, in SQLite, the header's
# application id ("hpct"). A database without it is another application's, left untouched.
MARK_TABLE = "hpctrain_index"
APPLICATION_ID = 0x68706374
TABLES = {"schema_version", "runs", "evals", "folders"}
BATCH = 500  # runs per transaction while scanning
RACY_SECONDS = 5.0  # a folder changed this recently is listed again by the next refresh
USAGE_KEYS = {"user": "user_name", "recipe": "recipe", "cluster": "cluster", "month": "month"}
# the status as read: a silent running run is lost
STATE = "CASE WHEN status = 'running' AND (heartbeat IS NULL OR heartbeat < ?) THEN 'lost' " \
        "ELSE status END"


@dataclass
class Refreshed:
    read: int = 0  # run directories (re)read
    unchanged: int = 0
    missing: int = 0  # rows whose folder is gone


class Index:
    def __init__(self, db: Database):
        self.db = db
        self._create()

    def _create(self) -> None:
        db = self.db
        if db.read_only:
            self._recognise()
            found = {r["version"] for r in db.rows("SELECT version FROM schema_version")} \
                if db.has_table("schema_version") else {0}
            if found != {SCHEMA_VERSION}:
                raise ConfigError(f"the runs index {db.where} is read-only and of another "
                                  f"hpctrain version (schema {min(found, default=None)}); "
                                  "give a writable --db to rebuild it from the run folders")
            return
        db.lock_schema()
        unmarked = self._recognise()
        if unmarked:  # in the schema's transaction: an index of another version keeps none
            db.execute(f"CREATE TABLE {MARK_TABLE} (application TEXT)")
            db.execute(f"INSERT INTO {MARK_TABLE} (application) VALUES (?)",
                       ("hpctrain runs index: the run directories are the truth; rebuilt by "
                        "hpctrain runs",))
        unversioned = db.has_table("runs") and not db.has_table("schema_version")
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
        found = [r["version"] for r in db.rows("SELECT version FROM schema_version")]
        if unversioned:  # written before the version was kept
            db.execute("INSERT INTO schema_version (version) VALUES (0)")
            found = [0]
        if found and set(found) != {SCHEMA_VERSION}:
            self._replace_old_schema(min(found))
        if not found:
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
        db.execute(f"CREATE TABLE IF NOT EXISTS runs ({columns})")
        db.execute("CREATE TABLE IF NOT EXISTS evals (run_id TEXT, step INTEGER, metric TEXT, "
                   "value DOUBLE PRECISION, elapsed_seconds DOUBLE PRECISION, "
                   "device_hours DOUBLE PRECISION, energy_joules DOUBLE PRECISION, "
                   "PRIMARY KEY (run_id, step, metric))")
        # the folders of runs a refresh listed, and their times then (refresh)
        db.execute("CREATE TABLE IF NOT EXISTS folders (path TEXT PRIMARY KEY, "
                   "mtime DOUBLE PRECISION)")
        db.execute("CREATE INDEX IF NOT EXISTS runs_path ON runs (path)")
        db.execute("CREATE INDEX IF NOT EXISTS runs_recipe ON runs (recipe)")
        db.commit()
        if unmarked:
            db.mark_sqlite_file(APPLICATION_ID)

    def _recognise(self) -> bool:
        """Whether the database is an index hpctrain wrote (its mark, or the tables of one
        written before the mark, whose runs table holds only hpctrain's columns) or empty:
        True where the mark is still to be written. Anything else is another application's
        database: refused, untouched."""
        db = self.db
        tables = db.tables()
        if MARK_TABLE in tables:
            return False
        ours_before_the_mark = tables <= TABLES and "runs" in tables and \
            {"run_id", "path"} <= db.columns("runs") <= set(COLUMNS)
        if tables and not ours_before_the_mark:
            db.rollback()
            shown = ", ".join(sorted(tables)[:6]) + (", ..." if len(tables) > 6 else "")
            raise ConfigError(f"--db {db.where} is not an hpctrain runs index (it holds the "
                              f"tables {shown}, and no {MARK_TABLE} table): hpctrain leaves "
                              "another application's database as it is. Give a new file, "
                              "or an empty database")
        if db.read_only and not tables:
            raise ConfigError(f"the runs index {db.where} is read-only and empty; give a "
                              "writable --db")
        return True

    def _replace_old_schema(self, version: int) -> None:
        """An index another hpctrain version wrote. A user's SQLite file is a cache of the
        run directories: rebuilt (by the next scan). A shared PostgreSQL index holds other
        users' rows: left alone, and said."""
        if self.db.postgres:
            self.db.rollback()
            raise ConfigError(
                f"the runs index {self.db.where} was written by another hpctrain version "
                f"(schema {version}, this one writes {SCHEMA_VERSION}); use the same version "
                "as the team, or an empty database (the index is rebuilt from the run "
                "directories by hpctrain runs --root DIR)")
        for table in ("runs", "evals", "folders"):
            self.db.execute(f"DROP TABLE IF EXISTS {table}")
        self.db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    # ---- writing

    def put(self, row: dict, evals: list[tuple] | None, commit: bool = True) -> None:
        """Insert or update one run (by run_id); its evaluations replaced when given. In one
        transaction (committed here unless `commit` is False: the caller batches), so a reader
        never sees a run without its evaluations."""
        names = list(COLUMNS)
        updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != "run_id")
        try:
            self.db.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES "
                            f"({', '.join('?' * len(names))}) ON CONFLICT (run_id) DO UPDATE "
                            f"SET {updates}", [row.get(n) for n in names])
            if evals is not None:
                self.db.execute("DELETE FROM evals WHERE run_id = ?", (row["run_id"],))
                self.db.executemany(
                    f"INSERT INTO evals ({', '.join(EVAL_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(row["run_id"], *e) for e in _unique(evals)])
            if commit:
                self.db.commit()
        except Exception:
            self.db.rollback()
            raise

    def refresh(self, roots: list[Path], rescan: bool = False) -> Refreshed:
        """Reread the runs under `roots` whose files changed; mark the rows whose folder is
        gone. A folder of runs whose time is unchanged since it was listed is not listed
        again, and a finished run in it not even looked at; a finished run whose own folder
        is unchanged is not listed. `rescan`: every run's files are checked."""
        done, started = Refreshed(), time.time()
        rows = self.db.execute("SELECT path, signature, status, folder_mtime FROM runs")\
            .fetchall()
        known = {path: sign for path, sign, _, _ in rows}
        settled = {} if rescan else {path: float(when) for path, _, status, when in rows
                                     if status in FINAL and when is not None}
        listed = {} if rescan else {path: float(when) for path, when in self.db.execute(
            "SELECT path, mtime FROM folders").fetchall()}
        indexed: dict[str, list[str]] = {}  # folder -> the runs in it
        for path, _, status, _ in rows:
            if status != "missing":
                indexed.setdefault(os.path.dirname(path), []).append(path)
        seen, times = set(), {}
        for root in roots:
            found, listed_now = candidate_dirs(root, settled, listed, indexed)
            times.update(listed_now)
            for path, still in found:
                seen.add(path)
                if still or known.get(path) == signature(Path(path)):
                    done.unchanged += 1
                    continue
                row, evals = scan_run(Path(path))
                self.put(row, evals, commit=False)
                done.read += 1
                if done.read % BATCH == 0:
                    self.db.commit()
        for root in roots:
            prefix = str(root).rstrip("/") + "/"
            gone = [p for p in known if p.startswith(prefix) and p not in seen
                    and not Path(p).exists()]
            for path in gone:
                self.db.execute("UPDATE runs SET status = 'missing', problem = ? WHERE path = ? "
                                "AND status <> 'missing'", (f"{path} no longer exists", path))
                done.missing += 1
        self._remember_listed(times, started)
        self.db.commit()
        return done

    def _remember_listed(self, times: dict[str, float], started: float) -> None:
        """The times of the folders just listed, for the next refresh to skip those unchanged;
        not one changed within RACY_SECONDS of the listing (a change right after it could
        leave the same time, on a file system counting whole seconds or a server's clock)."""
        for folder, when in times.items():
            if when < started - RACY_SECONDS:
                self.db.execute("INSERT INTO folders (path, mtime) VALUES (?, ?) ON CONFLICT "
                                "(path) DO UPDATE SET mtime = excluded.mtime", (folder, when))
            else:
                self.db.execute("DELETE FROM folders WHERE path = ?", (folder,))

    # ---- reading

    def runs(self, recipe: str | None = None, status: str | None = None,
             user: str | None = None, since: float | None = None, limit: int | None = None,
             now: float | None = None) -> list[dict]:
        """Rows newest first, `status` as read (lost included), filtered."""
        where, params = ["1 = 1"], [_lost_before(now)]
        for column, value in (("recipe", recipe), ("user_name", user)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if since is not None:
            where.append("started >= ?")
            params.append(since)
        sql = f"SELECT * FROM (SELECT {', '.join(c for c in COLUMNS if c != 'status')}, " \
              f"{STATE} AS status FROM runs) AS r WHERE {' AND '.join(where)}"
        if status is not None:
            sql += " AND status = ?"
            params.append(status)
        sql += " ORDER BY started DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return self.db.rows(sql, params)

    def find(self, reference: str, now: float | None = None) -> dict:
        """One run by run_id (or its first characters), folder name or path."""
        path = str(Path(reference).expanduser().absolute())
        rows = [r for r in self.runs(now=now) if reference in (r["run_id"], r["name"])
                or r["path"] == path]
        if not rows:
            rows = [r for r in self.runs(now=now)
                    if len(reference) >= 6 and r["run_id"].startswith(reference)]
        if len(rows) == 1:
            return rows[0]
        if not rows:
            raise ConfigError(f"no run {reference!r} in the index ({self.db.where}); give a "
                              "run id, a run folder's name or its path (hpctrain runs lists "
                              "them; --root DIR adds an output directory)")
        raise ConfigError(f"{reference!r} names {len(rows)} runs: "
                          + ", ".join(r["path"] for r in rows[:5]) + "; give the run id or "
                          "the path")

    def usage(self, by: str, now: float | None = None) -> list[dict]:
        """Per user, recipe, cluster or month: runs, GPU-hours (device-hours of runs on
        GPUs), all device-hours, kWh, the share of runs that failed or were lost, and the
        goodput: the productive device-hours over the device-hours of the runs that tell
        them (runs of an older hpctrain do not)."""
        key = USAGE_KEYS[by]
        return self.db.rows(
            f"SELECT {key} AS key, COUNT(*) AS runs, "
            "SUM(CASE WHEN gpu_count > 0 THEN device_hours ELSE 0 END) AS gpu_hours, "
            "SUM(device_hours) AS device_hours, SUM(energy_joules) / 3600000.0 AS kwh, "
            "SUM(productive_hours) / NULLIF(SUM(CASE WHEN productive_hours IS NOT NULL "
            "THEN device_hours END), 0) AS goodput, "
            "SUM(CASE WHEN state IN ('failed', 'lost') THEN 1 ELSE 0 END) * 1.0 / COUNT(*) "
            "AS failed_share "
            f"FROM (SELECT *, {STATE} AS state FROM runs) AS r "
            f"GROUP BY {key} ORDER BY gpu_hours DESC, device_hours DESC, key",
            [_lost_before(now)])

    def leaderboard(self, recipe: str, metric: str, target: float, higher: bool) -> dict:
        """The race to `metric` >= target (<= when not `higher`): per run, the first
        evaluation that reached it and what it took (time, device-hours, energy), fastest
        first; and the runs that did not reach it, with their best."""
        compare = ">=" if higher else "<="
        reached = self.db.rows(
            "SELECT r.run_id, r.name, r.path, r.user_name, r.gpu_model, r.gpu_count, "
            "e.step, e.elapsed_seconds, e.device_hours, e.energy_joules, e.value "
            "FROM runs r JOIN evals e ON e.run_id = r.run_id "
            "JOIN (SELECT run_id, MIN(step) AS step FROM evals WHERE metric = ? AND "
            f"value {compare} ? GROUP BY run_id) AS first "
            "ON first.run_id = e.run_id AND first.step = e.step "
            "WHERE r.recipe = ? AND e.metric = ? "
            "ORDER BY e.elapsed_seconds IS NULL, e.elapsed_seconds, e.device_hours",
            (metric, target, recipe, metric))
        best = "MAX" if higher else "MIN"
        missed = self.db.rows(
            f"SELECT r.run_id, r.name, r.path, {best}(e.value) AS best FROM runs r "
            "JOIN evals e ON e.run_id = r.run_id WHERE r.recipe = ? AND e.metric = ? "
            "AND r.run_id NOT IN (SELECT run_id FROM evals WHERE metric = ? AND "
            f"value {compare} ?) GROUP BY r.run_id, r.name, r.path ORDER BY best "
            f"{'DESC' if higher else 'ASC'}", (recipe, metric, metric, target))
        return {"reached": reached, "missed": missed}


def _lost_before(now: float | None) -> float:
    return (time.time() if now is None else now) - LOST_AFTER_SECONDS


def _unique(evals: list[tuple]) -> list[tuple]:
    """One figure per (step, metric): a step evaluated twice (a resume) keeps the last."""
    return list({(e[0], e[1]): e for e in evals}.values())
