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
    """One connection and its dialect; `read_only`: an SQLite file this user may not write,
    read as it is."""

    def __init__(self, connection, postgres: bool, where: str, read_only: bool = False):
        self.connection, self.postgres, self.where = connection, postgres, where
        self.read_only = read_only

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
        return name in self.tables()

    def tables(self) -> set[str]:
        """The tables of the database (PostgreSQL: of the connection's schema)."""
        if self.postgres:
            rows = self.rows("SELECT table_name AS name FROM information_schema.tables "
                             "WHERE table_schema = current_schema()")
        else:
            rows = self.rows("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {row["name"] for row in rows}

    def columns(self, table: str) -> set[str]:
        if self.postgres:
            rows = self.rows("SELECT column_name AS name FROM information_schema.columns "
                             "WHERE table_schema = current_schema() AND table_name = ?",
                             (table,))
        else:
            rows = self.rows("SELECT name FROM pragma_table_info(?)", (table,))
        return {row["name"] for row in rows}

    def mark_sqlite_file(self, application_id: int) -> None:
        """SQLite's header field for the application that owns the file (`file` shows it),
        and the write-ahead log, which the file keeps once set: called only on a file
        recognised as hpctrain's own, never on another application's database."""
        if not self.postgres:
            self.execute(f"PRAGMA application_id = {int(application_id)}")
            self.commit()
            _write_ahead_log(self.connection)

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
    """`where`: a PostgreSQL URL, a path for SQLite, or None for the default file. Nothing
    is changed in the file here: whether it is an index at all is the Index's to say. Only
    the default file's folder is created; a file this user cannot write is opened to read."""
    if where and where.startswith(POSTGRES):
        return _postgres(where)
    path = Path(where).expanduser() if where else default_location()
    if path.is_dir():
        raise ConfigError(f"--db {path} is a folder; give the runs index's file, e.g. "
                          f"{path / 'runs.sqlite'}")
    if where and not path.parent.is_dir():
        raise ConfigError(f"--db {path}: the folder {path.parent} does not exist; create it, "
                          "or give a path in an existing folder")
    read_only = path.exists() and not (os.access(path, os.W_OK) and
                                       os.access(path.parent, os.W_OK))
    try:
        if where is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        if read_only:  # immutable: a WAL file's shared memory cannot be made beside it
            connection = sqlite3.connect(f"{path.absolute().as_uri()}?immutable=1", uri=True)
        else:
            connection = sqlite3.connect(path, timeout=60)
            connection.execute("PRAGMA synchronous=NORMAL")  # enough for an index in WAL
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()  # a database?
    except (OSError, sqlite3.Error) as err:
        raise ConfigError(f"--db {path}: cannot open the runs index there ({err}); give a "
                          "writable path on local disk, or a postgresql:// URL. The index "
                          "only mirrors the run directories: a damaged file can be removed, "
                          "the next hpctrain runs rebuilds it") from None
    return Database(connection, False, str(path), read_only)


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
    try:  # the URL is never shown whole: it may hold a password
        parts = urlsplit(url)
        host, port = parts.hostname or "localhost", parts.port or 5432
    except ValueError as err:  # "Invalid IPv6 URL", a port out of range or not a number
        raise ConfigError(f"--db postgresql://...: the URL cannot be read ({err}); write it "
                          "as postgresql://USER@HOST:PORT/DATABASE, an IPv6 host in brackets "
                          "([::1])") from None
    try:
        import psycopg
    except ImportError:
        raise ConfigError("--db postgresql://...: the PostgreSQL driver is not installed; "
                          "pip install 'hpctrain[postgres]'") from None
    shown = f"{parts.scheme}://{host}:{port}{parts.path}"  # never the password
    try:
        connection = psycopg.connect(url, connect_timeout=10)
    except psycopg.Error as err:  # unreachable, refused, or a connection string it refuses
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise ConfigError(f"--db {shown}: cannot reach PostgreSQL at host {host} port {port} "
                          f"({reason}); check the URL, that the server runs, and that this "
                          "node may reach it") from None
    return Database(connection, True, shown)
