"""Where the runs index lives: an SQLite file on local disk (the default, one per user), or a
PostgreSQL database shared by a team or a centre (`--db postgresql://...` or HPCTRAIN_DB).

The same SQL serves both: the differences (parameter marks, the schema lock) stay here.
SQLite is never put on the parallel file system: its locking there is unreliable, and the
index is rebuilt from the run directories at any time, so a local file loses nothing.
"""

from __future__ import annotations

import os
import sqlite3
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

from hpctrain.errors import ConfigError

POSTGRES = ("postgresql://", "postgres://")


def default_location() -> Path:
    """$XDG_DATA_HOME/hpctrain/runs.sqlite (~/.local/share/hpctrain/runs.sqlite)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "hpctrain" / "runs.sqlite"


class Database:
    """One connection and its dialect."""

    def __init__(self, connection, postgres: bool, where: str):
        self.connection, self.postgres, self.where = connection, postgres, where

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def execute(self, sql: str, params: tuple | list = ()):
        cursor = self.connection.cursor()
        cursor.execute(self._sql(sql), tuple(params))
        return cursor

    def executemany(self, sql: str, rows: list) -> None:
        if rows:
            self.connection.cursor().executemany(self._sql(sql), rows)

    def rows(self, sql: str, params: tuple | list = ()) -> list[dict]:
        cursor = self.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, map(_plain, values))) for values in cursor.fetchall()]

    def commit(self) -> None:
        self.connection.commit()

    def rollback(self) -> None:
        self.connection.rollback()

    def has_table(self, name: str) -> bool:
        if self.postgres:
            return self.rows("SELECT to_regclass(?) AS found", (name,))[0]["found"] is not None
        return bool(self.rows("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                              "name = ?", (name,)))

    def lock_schema(self) -> None:
        """Serialise schema creation between processes until the next commit. PostgreSQL
        races on CREATE TABLE IF NOT EXISTS. SQLite commits each CREATE on its own, so two
        processes creating a new index could both find no schema version and both write
        one: the write lock is taken first (BEGIN IMMEDIATE waits on the busy timeout)."""
        if self.postgres:
            self.execute("SELECT pg_advisory_xact_lock(80420)")
        elif not self.connection.in_transaction:
            self.execute("BEGIN IMMEDIATE")

    def close(self) -> None:
        self.connection.close()


def _plain(value):
    """PostgreSQL's NUMERIC results (sums, shares) as the floats SQLite gives."""
    return float(value) if isinstance(value, Decimal) else value


def open_database(where: str | None) -> Database:
    """`where`: a PostgreSQL URL, a path for SQLite, or None for the default file."""
    if where and where.startswith(POSTGRES):
        return _postgres(where)
    path = Path(where).expanduser() if where else default_location()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, timeout=60)
        _write_ahead_log(connection)
        connection.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; it is an index
    except (OSError, sqlite3.Error) as err:
        raise ConfigError(f"--db {path}: cannot open the runs index there ({err}); give a "
                          "writable path on local disk, or a postgresql:// URL. The index "
                          "only mirrors the run directories: a damaged file can be removed, "
                          "the next hpctrain runs rebuilds it") from None
    return Database(connection, False, str(path))


def _write_ahead_log(connection: sqlite3.Connection) -> None:
    """WAL mode, which the file keeps once set. Switching to it takes the file for a moment
    without waiting on the busy timeout: processes opening a new index at once retry."""
    for attempt in range(50):
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or attempt == 49:
                raise
            time.sleep(0.1)


def _postgres(url: str) -> Database:
    try:
        import psycopg
    except ImportError:
        raise ConfigError("--db postgresql://...: the PostgreSQL driver is not installed; "
                          "pip install 'hpctrain[postgres]'") from None
    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or 5432
    shown = f"{parts.scheme}://{host}:{port}{parts.path}"  # never the password
    try:
        connection = psycopg.connect(url, connect_timeout=10)
    except psycopg.OperationalError as err:
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise ConfigError(f"--db {shown}: cannot reach PostgreSQL at host {host} port {port} "
                          f"({reason}); check the URL, that the server runs, and that this "
                          "node may reach it") from None
    return Database(connection, True, shown)
