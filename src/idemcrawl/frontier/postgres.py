"""The PostgreSQL frontier: the contract of ``sqlite.py``, shared by processes on many machines.

Why it is built this way:

* **One schema per crawl.** Every table lives in a dedicated schema (default ``idemcrawl``)
  reached through ``search_path``, so one database can hold several crawls (and the tests can
  give each test its own) and the SQL text stays identical to the SQLite backend's.
* **Versioned migrations inside the tool.** ``schema_version`` records what was applied; each
  migration runs in its own transaction under a transaction-scoped advisory lock, so several
  crawlers opening a new crawl at once serialise instead of racing on ``CREATE``. The migrations
  are Python strings, so the wheel needs no package data.
* **Statement-level triggers keep ``hosts.queued`` / ``hosts.in_flight``** equal to the counts of
  the host's URLs in ``queued`` / ``leased`` (invariant I6), exactly like the SQLite row triggers
  but with one write per host per statement instead of one per URL, and with the host rows taken
  in key order.
* **Row locks instead of one database-wide writer.** SQLite serialises every write transaction
  (``BEGIN IMMEDIATE``); here a leaser picks ready hosts with ``FOR UPDATE SKIP LOCKED``, so two
  leasers — threads, processes or machines — never grant on the same host at once, never wait
  for each other, and the host's token (``next_allowed_at``) moves in the same transaction. Every
  other writer locks the existing host rows it will touch first, in key order, so writers queue
  behind each other instead of deadlocking; the rare deadlock that remains (two transactions
  creating the same two new hosts in opposite orders) is retried like a lost connection.
* **Connection loss is survived.** Each public method is one transaction function; an
  ``OperationalError`` (connection dropped, server restarted, deadlock, serialisation failure)
  makes it reconnect and run the whole transaction again, with exponential back-off and jitter,
  for up to ``retry_seconds``. When a commit's acknowledgement is lost, the transaction's id
  (fetched just before ``COMMIT``) is looked up with ``pg_xact_status`` on the new connection:
  if it committed, its result is returned instead of running it again, so retries never
  double-count. Without that answer (the server forgot the id, or never answered in time) the
  transaction is run again; the lease fencing and the ``ON CONFLICT`` clauses make that a no-op
  for URLs, records and events, and only the counters and the returned values (``add``'s count,
  a ``complete`` reported as rejected) can then be off by that one transaction.
* **Counters are written last, in name order, in one statement**, because every transaction
  bumps the same few rows: taking them just before ``COMMIT`` keeps the hot rows locked for the
  shortest time and in one global order.

Requires PostgreSQL 13 or newer (``pg_xact_status``) and psycopg 3.1+.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from .. import robots
from ..politeness import (
    MAX_STREAK_SHIFT,
    allowance,
    backoff_seconds,
    effective_delay,
    update_latency,
)
from ..robots import RobotsState, needs_fetch, state_from_row, state_to_row
from ..robots import outcome as robots_outcome
from .base import (
    DONE_COLUMNS,
    DOWNLOAD,
    FAILED,
    LEASED,
    PAGE,
    QUEUED,
    ROBOTS,
    STATES,
    Completion,
    Failure,
    Fence,
    FrontierError,
    FrontierStats,
    HostPolicy,
    Lease,
    NewURL,
    PartitionBusy,
    Progress,
    Reparsed,
    StaleEpoch,
    completion_counters,
    control_value,
    done_values,
    event_values,
    redirect_loop,
    sitemap_urls,
    status_class,
)

# The host-row shape and the "defer this host" rule are the SQLite backend's own, imported rather
# than copied so that both backends cannot drift apart.
from .sqlite import (
    PICK_COLS,
    REPARSE_COLS,
    _defer_reason,
    _HostRow,
    budget_day,
    budget_left,
    lease_from_row,
)

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
except ImportError:  # the optional "postgres" extra is not installed
    psycopg = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from psycopg import Connection, Cursor

T = TypeVar("T")

SCHEMA_VERSION = 3
DEFAULT_SCHEMA = "idemcrawl"
#: Oldest server with ``pg_xact_status`` / ``pg_current_xact_id_if_assigned``.
MIN_SERVER_VERSION = 130000
#: First key of the advisory lock that serialises migrations (the second is the schema's hash).
_MIGRATION_LOCK = 0x1DEC0C4A
#: Reconnect back-off: full-jitter exponential from the base, capped, for ``retry_seconds``.
_BACKOFF_BASE = 0.05
_BACKOFF_CAP = 5.0
#: A transaction left open this long by a frozen client is ended by the server, releasing the
#: host locks it holds; the client's next call reconnects and runs the transaction again.
_IDLE_IN_TX_TIMEOUT = "60s"
#: Connection defaults the DSN may override: fail a connect in bounded time, notice a dead
#: server within about half a minute instead of the OS's two hours, name ourselves in
#: pg_stat_activity.
_CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "application_name": "idemcrawl",
}

_COUNT_QUEUED_ON_INSERT = """
CREATE FUNCTION urls_count_insert() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO hosts AS h (host_key, queued, in_flight)
    SELECT host_key,
           count(*) FILTER (WHERE state = 'queued'),
           count(*) FILTER (WHERE state = 'leased')
      FROM new_rows GROUP BY host_key ORDER BY host_key
    ON CONFLICT (host_key) DO UPDATE
       SET queued = h.queued + excluded.queued, in_flight = h.in_flight + excluded.in_flight
     WHERE excluded.queued <> 0 OR excluded.in_flight <> 0;
    RETURN NULL;
END
$$"""

# Transition tables cannot be combined with "UPDATE OF state", so the update trigger sees every
# UPDATE of urls; rows whose state did not change cancel out (+1 new, -1 old) and touch nothing.
_COUNT_QUEUED_ON_UPDATE = """
CREATE FUNCTION urls_count_update() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE hosts AS h SET queued = h.queued + d.dq, in_flight = h.in_flight + d.dl
      FROM (SELECT host_key, sum(dq) AS dq, sum(dl) AS dl
              FROM (SELECT host_key, (state = 'queued')::int AS dq, (state = 'leased')::int AS dl
                      FROM new_rows
                    UNION ALL
                    SELECT host_key, -(state = 'queued')::int, -(state = 'leased')::int
                      FROM old_rows) AS c
             GROUP BY host_key
            HAVING sum(dq) <> 0 OR sum(dl) <> 0) AS d
     WHERE h.host_key = d.host_key;
    RETURN NULL;
END
$$"""

# SQLite has no delete trigger because nothing deletes URLs; one here keeps I6 true even for a
# manual clean-up.
_COUNT_QUEUED_ON_DELETE = """
CREATE FUNCTION urls_count_delete() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE hosts AS h SET queued = h.queued - d.dq, in_flight = h.in_flight - d.dl
      FROM (SELECT host_key,
                   count(*) FILTER (WHERE state = 'queued') AS dq,
                   count(*) FILTER (WHERE state = 'leased') AS dl
              FROM old_rows GROUP BY host_key) AS d
     WHERE h.host_key = d.host_key AND (d.dq <> 0 OR d.dl <> 0);
    RETURN NULL;
END
$$"""

# The same logical schema and version numbers as the SQLite backend (see sqlite.py for what each
# column is for). Each migration is a tuple of statements, applied in one transaction.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL DEFAULT 0)",
        "CREATE TABLE seeds (host_key TEXT PRIMARY KEY)",
        """
CREATE TABLE hosts (
    host_key          TEXT PRIMARY KEY,
    next_allowed_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    in_flight         INTEGER NOT NULL DEFAULT 0,
    queued            INTEGER NOT NULL DEFAULT 0,
    max_in_flight     INTEGER,
    delay             DOUBLE PRECISION,
    backoff_until     DOUBLE PRECISION NOT NULL DEFAULT 0,
    error_streak      INTEGER NOT NULL DEFAULT 0,
    latency_ewma      DOUBLE PRECISION,
    paused            INTEGER NOT NULL DEFAULT 0,
    pause_reason      TEXT,
    robots_state      TEXT,
    robots_body       BYTEA,
    robots_fetched_at DOUBLE PRECISION,
    robots_expires_at DOUBLE PRECISION,
    crawl_delay       DOUBLE PRECISION,
    budget_day        TEXT,
    budget_used       INTEGER NOT NULL DEFAULT 0
)""",
        "CREATE INDEX hosts_ready ON hosts (next_allowed_at) WHERE queued > 0",
        """
CREATE TABLE urls (
    url_id           BIGSERIAL PRIMARY KEY,
    url              TEXT NOT NULL UNIQUE,
    host_key         TEXT NOT NULL,
    state            TEXT NOT NULL DEFAULT 'queued',
    reason           TEXT,
    version          INTEGER NOT NULL DEFAULT 1,
    priority         INTEGER NOT NULL DEFAULT 0,
    depth            INTEGER NOT NULL DEFAULT 0,
    due_at           DOUBLE PRECISION NOT NULL DEFAULT 0,
    discovered_at    DOUBLE PRECISION NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_token      BIGINT,
    lease_expires_at DOUBLE PRECISION,
    leased_at        DOUBLE PRECISION,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    status_code      INTEGER,
    fetched_at       DOUBLE PRECISION,
    body_bytes       BIGINT,
    content_hash     TEXT,
    simhash          BIGINT,
    etag             TEXT,
    last_modified    TEXT,
    next_fetch_at    DOUBLE PRECISION,
    revisit_interval DOUBLE PRECISION,
    canonical_hint   TEXT,
    warc_file        TEXT,
    warc_offset      BIGINT,
    warc_length      BIGINT,
    payload_digest   TEXT
)""",
        "CREATE INDEX urls_queue ON urls (host_key, priority DESC, due_at) WHERE state = 'queued'",
        "CREATE INDEX urls_leases ON urls (lease_expires_at) WHERE state = 'leased'",
        "CREATE INDEX urls_state ON urls (state)",
        _COUNT_QUEUED_ON_INSERT,
        _COUNT_QUEUED_ON_UPDATE,
        _COUNT_QUEUED_ON_DELETE,
        "CREATE TRIGGER urls_insert AFTER INSERT ON urls REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_insert()",
        "CREATE TRIGGER urls_state AFTER UPDATE ON urls "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_update()",
        "CREATE TRIGGER urls_delete AFTER DELETE ON urls REFERENCING OLD TABLE AS old_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION urls_count_delete()",
        """
CREATE TABLE records (
    record_id    TEXT PRIMARY KEY,
    source       TEXT NOT NULL,
    key          TEXT NOT NULL,
    url          TEXT NOT NULL,
    data         TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    first_seen   DOUBLE PRECISION NOT NULL,
    last_changed DOUBLE PRECISION NOT NULL
)""",
        """
CREATE TABLE events (
    event_id     BIGSERIAL PRIMARY KEY,
    url_id       BIGINT NOT NULL,
    url_version  INTEGER NOT NULL,
    url          TEXT NOT NULL,
    status       INTEGER,
    fetched_at   DOUBLE PRECISION,
    content_hash TEXT,
    records      INTEGER NOT NULL DEFAULT 0,
    links        INTEGER NOT NULL DEFAULT 0,
    warc_file    TEXT,
    warc_offset  BIGINT,
    warc_length  BIGINT,
    created_at   DOUBLE PRECISION NOT NULL,
    UNIQUE (url_id, url_version)
)""",
        "CREATE TABLE deliveries (consumer TEXT PRIMARY KEY, cursor BIGINT NOT NULL DEFAULT 0)",
        """
CREATE TABLE partitions (
    partition  INTEGER PRIMARY KEY,
    owner      TEXT,
    epoch      BIGINT NOT NULL DEFAULT 0,
    expires_at DOUBLE PRECISION NOT NULL DEFAULT 0
)""",
    ),
    # 2: robots.txt as a URL kind, host back-off reasons, the politeness audit log.
    (
        "ALTER TABLE urls ADD COLUMN kind TEXT NOT NULL DEFAULT 'page'",
        "ALTER TABLE hosts ADD COLUMN robots_meta TEXT",
        "ALTER TABLE hosts ADD COLUMN robots_failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE hosts ADD COLUMN backoff_reason TEXT",
        """
CREATE TABLE lease_log (
    id               BIGSERIAL PRIMARY KEY,
    host_key         TEXT NOT NULL,
    url_id           BIGINT NOT NULL,
    kind             TEXT NOT NULL,
    granted_at       DOUBLE PRECISION NOT NULL,
    eligible_at      DOUBLE PRECISION NOT NULL,
    min_gap          DOUBLE PRECISION NOT NULL,
    allowance        INTEGER NOT NULL,
    in_flight_before INTEGER NOT NULL
)""",
        "CREATE INDEX lease_log_host ON lease_log (host_key, granted_at)",
    ),
    # 3: recrawl rounds, redirects, content dedup, per-host budgets (see sqlite.py).
    (
        "ALTER TABLE urls ADD COLUMN hops INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE urls ADD COLUMN redirect_to TEXT",
        "ALTER TABLE urls ADD COLUMN near_dup_of BIGINT",
        "ALTER TABLE urls ADD COLUMN stored_file TEXT",
        "ALTER TABLE hosts ADD COLUMN budget INTEGER",
        "ALTER TABLE events ADD COLUMN payload_digest TEXT",
        "CREATE INDEX urls_refetch ON urls (next_fetch_at) WHERE state = 'done'",
        "CREATE INDEX urls_due ON urls (due_at) WHERE state = 'queued'",
        """
CREATE TABLE bodies (
    payload_digest TEXT PRIMARY KEY,
    url_id         BIGINT NOT NULL,
    url            TEXT NOT NULL,
    warc_file      TEXT NOT NULL,
    warc_offset    BIGINT NOT NULL,
    warc_length    BIGINT NOT NULL,
    first_seen     DOUBLE PRECISION NOT NULL
)""",
    ),
]
assert len(MIGRATIONS) == SCHEMA_VERSION

_HOST_COLS = ", ".join(_HostRow._fields)

_INSERT_URLS = (
    "INSERT INTO urls (url, host_key, state, reason, priority, depth, due_at, discovered_at, "
    "kind, hops) SELECT u, h, s, r, p, d, %s, %s, k, n "
    "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::int[], "
    "%s::text[], %s::int[]) AS l(u, h, s, r, p, d, k, n) "
    "ON CONFLICT (url) DO NOTHING"
)

_UPSERT_RECORD = (
    "INSERT INTO records (record_id, source, key, url, data, content_hash, first_seen, "
    "last_changed) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (record_id) DO UPDATE SET data = excluded.data, "
    "content_hash = excluded.content_hash, last_changed = excluded.last_changed, "
    "url = excluded.url "
    "WHERE records.content_hash IS DISTINCT FROM excluded.content_hash"
)

_INSERT_EVENT = (
    "INSERT INTO events (url_id, url_version, url, status, fetched_at, content_hash, records, "
    "links, warc_file, warc_offset, warc_length, payload_digest, created_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (url_id, url_version) DO NOTHING"
)

#: Serialises the event-inserting tail of completion transactions, so event ids are handed out
#: in commit order and a reader's ``event_id > cursor`` never skips a late-committing event.
_EVENTS_LOCK = 0x1DEC0E7E

_URL_PICK_COLS = PICK_COLS

#: Column types of the fenced completion update's unnest (DONE_COLUMNS order).
_DONE_TYPES = {
    "status_code": "int",
    "fetched_at": "float8",
    "content_hash": "text",
    "body_bytes": "bigint",
    "last_error": "text",
    "etag": "text",
    "last_modified": "text",
    "next_fetch_at": "float8",
    "revisit_interval": "float8",
    "warc_file": "text",
    "warc_offset": "bigint",
    "warc_length": "bigint",
    "payload_digest": "text",
    "simhash": "bigint",
    "near_dup_of": "bigint",
    "canonical_hint": "text",
    "redirect_to": "text",
    "stored_file": "text",
}
_DONE_CAST: dict[str, Callable[[Any], Any]] = {
    col: {"int": int, "bigint": int, "float8": float, "text": str}[t]
    for col, t in _DONE_TYPES.items()
}
_DONE_SQL = (
    "UPDATE urls AS u SET state = 'done', attempts = 0, lease_owner = NULL, "
    "lease_token = NULL, lease_expires_at = NULL, "
    + ", ".join(
        f"{col} = COALESCE(c.{col}, u.{col})" if keep else f"{col} = c.{col}"
        for col, keep in DONE_COLUMNS
    )
    + " FROM unnest(%s::bigint[], %s::int[], %s::bigint[], "
    + ", ".join(f"%s::{_DONE_TYPES[col]}[]" for col, _ in DONE_COLUMNS)
    + ") AS c(url_id, version, token, "
    + ", ".join(col for col, _ in DONE_COLUMNS)
    + ") WHERE u.url_id = c.url_id AND u.state = 'leased' AND u.version = c.version "
    "AND u.lease_token = c.token RETURNING c.url_id, c.version, c.token"
)

_PickedRow = tuple[Any, ...]


@dataclass(slots=True)
class _Tx:
    """One attempt at one transaction: its cursor, plus what it learns and defers to the end.

    ``bumps`` are counter increments written just before COMMIT (see the module doc);
    ``latency`` caches the latency averages of the hosts this transaction has locked, so a batch
    of completions reads each one once.
    """

    cur: Cursor[Any]
    bumps: Counter[str] = field(default_factory=Counter)
    latency: dict[str, float | None] = field(default_factory=dict)

    def bump(self, name: str, n: int) -> None:
        if n:
            self.bumps[name] += n


@dataclass(slots=True)
class _Attempt:
    """What is known about an attempt when it fails: did it reach COMMIT, under which xid."""

    committing: bool = False
    xid: str | None = None
    result: Any = None


def _describe(params: dict[str, Any]) -> str:
    """host:port/dbname for messages, never the password."""
    host = params.get("host") or params.get("hostaddr") or "localhost"
    return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or '?'}"


def _schema_lock_key(schema: str) -> int:
    """A stable signed 32-bit key per schema for the migration advisory lock."""
    return int.from_bytes(
        hashlib.blake2b(schema.encode(), digest_size=4).digest(), "big", signed=True
    )


class PostgresFrontier:
    """Frontier backend on a PostgreSQL schema; safe to share between processes and machines.

    One connection per instance, used from one thread at a time (the engine calls the frontier
    from one dedicated thread; a lock makes other uses safe, not concurrent).
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        create: bool = True,
        retry_seconds: float = 60.0,
    ) -> None:
        if psycopg is None:
            raise FrontierError(
                "the PostgreSQL frontier needs psycopg 3: pip install 'idemcrawl[postgres]'"
            )
        self.schema = DEFAULT_SCHEMA if schema is None else schema
        if not self.schema or "\x00" in self.schema or len(self.schema.encode()) > 63:
            raise FrontierError(f"invalid PostgreSQL schema name {self.schema!r}")
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise FrontierError(f"invalid PostgreSQL connection string: {exc}") from exc
        self._dsn = dsn
        self._where = _describe(params)
        self._connect_kwargs = {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in params}
        self._create = create
        self.retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._rng = random.Random()
        self._jitter = random.Random()
        self._conn: Connection[Any] | None = None
        #: (pid, backend_start) of the live connection's server process, and of abandoned ones
        #: that may still hold locks and must be ended once we are connected again.
        self._backend: tuple[int, datetime] | None = None
        self._orphans: list[tuple[int, datetime]] = []
        self._closed = False
        self._pipelines = psycopg.Pipeline.is_supported()
        try:
            # Fail fast on the first connection: a wrong DSN, password or database should be
            # reported at once, not after a minute of retries. Losses after that are retried.
            self._conn = self._connect()
        except psycopg.Error as exc:
            raise FrontierError(f"cannot connect to PostgreSQL at {self._where}: {exc}") from exc
        try:
            self.migrate()
        except BaseException:
            self.close()
            raise

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def backend_pid(self) -> int | None:
        """Server process id of the current connection (diagnostics, connection-loss tests)."""
        return None if self._backend is None else self._backend[0]

    def _connect(self) -> Connection[Any]:
        conn = psycopg.connect(self._dsn, autocommit=False, **self._connect_kwargs)
        try:
            if conn.info.server_version < MIN_SERVER_VERSION:
                raise FrontierError(
                    f"PostgreSQL at {self._where} is version {conn.info.server_version}; the "
                    f"frontier needs {MIN_SERVER_VERSION // 10000} or newer"
                )
            with conn.cursor() as cur:
                cur.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
                cur.execute(f"SET idle_in_transaction_session_timeout = '{_IDLE_IN_TX_TIMEOUT}'")
                row = cur.execute(
                    "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
                ).fetchone()
            conn.commit()
        except BaseException:
            conn.close()
            raise
        self._backend = (int(row[0]), row[1]) if row else None
        return conn

    def _ensure_connection(self) -> Connection[Any]:
        """The live connection, reconnecting if needed and ending abandoned server processes.

        A connection lost on the client side (network cut, timeout) may leave its server process
        alive inside a transaction, holding host locks until the server notices; ending it at
        once lets the retried transaction proceed, and settles whether the lost one committed.
        """
        if self._conn is None:
            self._conn = self._connect()
        if self._orphans:
            conn = self._conn
            try:
                with conn.cursor() as cur:
                    for pid, started in self._orphans:
                        cur.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE pid = %s AND backend_start = %s",
                            (pid, started),
                        )
                conn.commit()
            except psycopg.Error:
                # Not allowed to signal it (other role): the server's own timeouts will end it.
                self._rollback_quietly()
                if conn.broken or conn.closed:
                    raise
            self._orphans.clear()
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if self._backend is not None:
            self._orphans.append(self._backend)
            self._backend = None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing left to do
                conn.close()

    def _rollback_quietly(self) -> None:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return
        try:
            conn.rollback()
        except psycopg.Error:
            self._drop_connection()

    def _run(self, fn: Callable[[_Tx], T], *, write: bool = True, snapshot: bool = False) -> T:
        """Run ``fn`` as one transaction, retrying it whole after a connection loss.

        ``write`` transactions learn their xid before COMMIT so that a lost acknowledgement can
        be resolved exactly (see the module doc); ``snapshot`` reads run at REPEATABLE READ so
        that their several statements see one state.
        """
        with self._lock:
            if self._closed:
                raise FrontierError("the PostgreSQL frontier is closed")
            started = time.monotonic()
            deadline = started + self.retry_seconds
            attempt = 0
            while True:
                state = _Attempt()
                try:
                    return self._attempt(fn, write, snapshot, state)
                except psycopg.Error as exc:
                    conn = self._conn
                    lost = conn is None or conn.closed or conn.broken
                    if lost:
                        self._drop_connection()
                    else:
                        self._rollback_quietly()
                    if not lost and not isinstance(exc, psycopg.OperationalError):
                        raise FrontierError(f"PostgreSQL error: {exc}") from exc
                    if state.committing and state.xid is not None:
                        outcome = self._commit_outcome(state.xid, deadline)
                        if outcome == "committed":
                            return state.result  # type: ignore[no-any-return]
                    attempt += 1
                    self._pause(attempt, started, deadline, exc)

    def _attempt(self, fn: Callable[[_Tx], T], write: bool, snapshot: bool, state: _Attempt) -> T:
        conn = self._ensure_connection()
        try:
            with conn.cursor() as cur:
                if snapshot:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                tx = _Tx(cur)
                result = fn(tx)
                if write:
                    state.xid = self._precommit(tx)
                state.result = result
                state.committing = True
                self._commit(conn)
                return result
        except BaseException as exc:
            if not isinstance(exc, psycopg.Error):
                self._rollback_quietly()
            raise

    def _batch(self, cur: Cursor[Any]) -> contextlib.AbstractContextManager[Any]:
        """Pipeline mode: statements whose results are not needed go out in one round trip.

        It needs libpq 14+ (psycopg[binary] bundles one); with an older libpq the same
        statements simply run one by one.
        """
        if self._pipelines:
            return cur.connection.pipeline()
        return contextlib.nullcontext()

    def _commit(self, conn: Connection[Any]) -> None:
        """COMMIT (a seam: tests replace it to lose the acknowledgement of a commit)."""
        conn.commit()

    @staticmethod
    def _precommit(tx: _Tx) -> str | None:
        """Write the counters (name order, one statement) and return the transaction id.

        The id is None when the transaction wrote nothing: running it again is then harmless.
        The outer query reads the id only after its FROM has run the counter insert, so the
        insert has already assigned one.
        """
        if tx.bumps:
            names = sorted(tx.bumps)
            row = tx.cur.execute(
                "WITH b AS (INSERT INTO counters (name, value) "
                "SELECT * FROM unnest(%s::text[], %s::bigint[]) "
                "ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value "
                "RETURNING 1) "
                "SELECT pg_current_xact_id_if_assigned()::text FROM (SELECT count(*) FROM b) AS n",
                (names, [tx.bumps[n] for n in names]),
            ).fetchone()
        else:
            row = tx.cur.execute("SELECT pg_current_xact_id_if_assigned()::text").fetchone()
        return None if row is None else row[0]

    def _commit_outcome(self, xid: str, deadline: float) -> str | None:
        """Whether a transaction whose COMMIT went unanswered committed; None if unknowable.

        Reconnecting first ends the old server process if it still lives, so "in progress"
        turns into committed or aborted within moments; an unreachable server is polled with
        a growing pause until the caller's deadline.
        """
        poll = 0.02
        while True:
            try:
                conn = self._ensure_connection()
                with conn.cursor() as cur:
                    row = cur.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
                conn.rollback()
                status = None if row is None else row[0]
                if status != "in progress":
                    return status
            except psycopg.Error:
                conn_now = self._conn
                if conn_now is None or conn_now.closed or conn_now.broken:
                    self._drop_connection()
                else:
                    self._rollback_quietly()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(poll, remaining))
            poll = min(poll * 2, 1.0)

    def _pause(self, attempt: int, started: float, deadline: float, exc: Exception) -> None:
        now = time.monotonic()
        if now >= deadline:
            raise FrontierError(
                f"PostgreSQL at {self._where} kept failing for {now - started:.1f} s "
                f"({attempt} attempts); giving up: {exc}"
            ) from exc
        ceiling = min(_BACKOFF_CAP, _BACKOFF_BASE * 2 ** min(attempt, 16))
        time.sleep(min(self._jitter.uniform(0, ceiling), deadline - now))

    @staticmethod
    def _lock_hosts(tx: _Tx, host_keys: Iterable[str], *, skip_locked: bool = False) -> set[str]:
        """Lock the existing rows of ``host_keys`` in key order; returns the keys locked.

        Taking them up front, in one global order, is what keeps writers from deadlocking on the
        host rows that the triggers update.
        """
        keys = sorted(set(host_keys))
        if not keys:
            return set()
        rows = tx.cur.execute(
            "SELECT host_key, latency_ewma FROM hosts WHERE host_key = ANY(%s::text[]) "
            "ORDER BY host_key FOR UPDATE" + (" SKIP LOCKED" if skip_locked else ""),
            (keys,),
        ).fetchall()
        tx.latency.update((r[0], r[1]) for r in rows)
        return {r[0] for r in rows}

    # -- migrations -----------------------------------------------------------------------------

    def migrate(self) -> int:
        """Bring the schema to SCHEMA_VERSION, one migration per transaction; returns the version.

        Safe when several processes open a new crawl at once: each step re-reads the version
        under the advisory lock, so a migration another process just applied is skipped.
        """
        version = self._run(self._bootstrap)
        while version < SCHEMA_VERSION:
            version = self._run(self._apply_next)
        return version

    def _lock_migrations(self, tx: _Tx) -> None:
        tx.cur.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            (_MIGRATION_LOCK, _schema_lock_key(self.schema)),
        )

    def _bootstrap(self, tx: _Tx) -> int:
        """Create the schema and its version table if needed; return the applied version."""
        cur = tx.cur
        self._lock_migrations(tx)
        exists = cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", (self.schema,)
        ).fetchone()
        if not (exists and exists[0]):
            if not self._create:
                raise FrontierError(f"no crawl in schema {self.schema!r} at {self._where}")
            cur.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
        versioned = cur.execute(
            "SELECT to_regclass(format('%%I.schema_version', %s::text)) IS NOT NULL",
            (self.schema,),
        ).fetchone()
        if not (versioned and versioned[0]):
            others = cur.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
                (self.schema,),
            ).fetchone()
            if others and others[0]:
                raise FrontierError(
                    f"schema {self.schema!r} at {self._where} holds tables but is not an "
                    "idemcrawl crawl"
                )
            if not self._create:
                raise FrontierError(f"no crawl in schema {self.schema!r} at {self._where}")
            cur.execute(
                "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
                "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            return 0
        return self._check_version(tx)

    def _check_version(self, tx: _Tx) -> int:
        row = tx.cur.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise FrontierError(
                f"schema {self.schema!r} at {self._where} has schema version {version}, newer "
                f"than this idemcrawl ({SCHEMA_VERSION}); upgrade idemcrawl"
            )
        return version

    def _apply_next(self, tx: _Tx) -> int:
        self._lock_migrations(tx)
        version = self._check_version(tx)
        if version >= SCHEMA_VERSION:
            return version
        for stmt in MIGRATIONS[version]:
            tx.cur.execute(stmt)
        tx.cur.execute("INSERT INTO schema_version (version) VALUES (%s)", (version + 1,))
        return version + 1

    # -- contract -------------------------------------------------------------------------------

    def add(self, urls: Iterable[NewURL], now: float) -> int:
        batch = list(urls)
        if not batch:
            return 0

        def tx_add(tx: _Tx) -> int:
            # Lock the hosts first, like every writer, so a concurrent completion inserting the
            # same link cannot wait on us while we wait on its host row.
            self._lock_hosts(tx, (u.host_key for u in batch))
            return self._insert_urls(tx, batch, now)

        return self._run(tx_add)

    @staticmethod
    def _insert_urls(tx: _Tx, batch: Sequence[NewURL], now: float) -> int:
        """Insert-if-absent in one statement; returns how many were new."""
        tx.cur.execute(
            _INSERT_URLS,
            (
                float(now),
                float(now),
                [u.url for u in batch],
                [u.host_key for u in batch],
                [u.state for u in batch],
                [u.reason for u in batch],
                [int(u.priority) for u in batch],
                [int(u.depth) for u in batch],
                [u.kind for u in batch],
                [int(u.hops) for u in batch],
            ),
        )
        return max(tx.cur.rowcount, 0)

    def lease(
        self,
        owner: str,
        limit: int,
        now: float,
        lease_seconds: float,
        policy: HostPolicy,
        fence: Fence | None = None,
    ) -> list[Lease]:
        if limit <= 0:
            return []

        def tx_lease(tx: _Tx) -> list[Lease]:
            if fence is not None:
                self._check_fence(tx, fence, owner, now)
            self._expire(tx, now, skip_locked=True)
            paused = tx.cur.execute(
                "SELECT 1 FROM meta WHERE key = 'paused' AND value = '1'"
            ).fetchone()
            if paused:
                return []  # the operator paused the whole crawl (idemcrawl control pause)
            # SKIP LOCKED: a host another leaser (or a completion) holds right now is simply not
            # ready for us; the rows we do get stay locked until COMMIT, so the in_flight and
            # next_allowed_at we read are the ones we update (I6).
            hosts = tx.cur.execute(
                f"SELECT {_HOST_COLS} FROM hosts WHERE queued > 0 AND next_allowed_at <= %s "
                "AND backoff_until <= %s AND paused = 0 "
                "AND in_flight < GREATEST(1, COALESCE(max_in_flight, %s::int) "
                ">> LEAST(error_streak, %s::int)) "
                # Only hosts with something due (see sqlite.py: no head-of-line starvation).
                "AND EXISTS (SELECT 1 FROM urls u WHERE u.host_key = hosts.host_key "
                "AND u.state = 'queued' AND u.due_at <= %s) "
                "ORDER BY next_allowed_at LIMIT %s FOR UPDATE SKIP LOCKED",
                (now, now, policy.max_in_flight, MAX_STREAK_SHIFT, now, limit * 2 + 8),
            ).fetchall()
            leases: list[Lease] = []
            expires = now + lease_seconds
            for row in hosts:
                room = limit - len(leases)
                if room <= 0:
                    break
                h = _HostRow(*row)
                leases.extend(self._lease_host(tx, h, owner, room, now, expires, policy))
            tx.bump("leases_granted", len(leases))
            return leases

        return self._run(tx_lease)

    @staticmethod
    def _check_fence(tx: _Tx, fence: Fence, owner: str, now: float) -> None:
        """I9: refuse a stale owner. FOR SHARE keeps a takeover from committing mid-grant."""
        row = tx.cur.execute(
            "SELECT owner, epoch, expires_at FROM partitions WHERE partition = %s FOR SHARE",
            (fence.partition,),
        ).fetchone()
        if row is None or row[1] != fence.epoch or row[0] != owner or row[2] <= now:
            current = "none" if row is None else f"epoch {row[1]} owned by {row[0]}"
            raise StaleEpoch(
                f"partition {fence.partition}: fence epoch {fence.epoch} of {owner} is stale "
                f"(current: {current})"
            )

    def acquire_partition(self, partition: int, owner: str, now: float, ttl: float) -> Fence:
        def tx_acquire(tx: _Tx) -> Fence:
            cur = tx.cur
            cur.execute(
                "INSERT INTO partitions (partition, owner, epoch, expires_at) "
                "VALUES (%s, NULL, 0, 0) ON CONFLICT (partition) DO NOTHING",
                (partition,),
            )
            row = cur.execute(
                "SELECT owner, epoch, expires_at FROM partitions WHERE partition = %s FOR UPDATE",
                (partition,),
            ).fetchone()
            assert row is not None
            cur_owner, epoch, expires_at = row
            if cur_owner == owner and expires_at > now:
                epoch = int(epoch)  # still ours: renew without a new epoch
            elif expires_at <= now or cur_owner is None:
                epoch = int(epoch) + 1  # take over: every earlier fence becomes stale
            else:
                raise PartitionBusy(
                    f"partition {partition} is owned by {cur_owner} for another "
                    f"{expires_at - now:.1f} s"
                )
            cur.execute(
                "UPDATE partitions SET owner = %s, epoch = %s, expires_at = %s "
                "WHERE partition = %s",
                (owner, epoch, now + ttl, partition),
            )
            return Fence(partition, epoch)

        return self._run(tx_acquire)

    def renew_partition(self, fence: Fence, owner: str, now: float, ttl: float) -> None:
        def tx_renew(tx: _Tx) -> None:
            tx.cur.execute(
                "UPDATE partitions SET expires_at = %s WHERE partition = %s AND owner = %s "
                "AND epoch = %s",
                (now + ttl, fence.partition, owner, fence.epoch),
            )
            if tx.cur.rowcount != 1:
                raise StaleEpoch(
                    f"partition {fence.partition}: cannot renew epoch {fence.epoch} for {owner}"
                )

        self._run(tx_renew)

    def _lease_host(
        self,
        tx: _Tx,
        h: _HostRow,
        owner: str,
        room: int,
        now: float,
        expires: float,
        policy: HostPolicy,
    ) -> list[Lease]:
        """Level 2 for one ready (and locked) host: its robots.txt first, then its best URLs."""
        configured = h.delay if h.delay is not None else policy.delay
        max_in_flight = h.max_in_flight if h.max_in_flight is not None else policy.max_in_flight
        state: RobotsState | None = None
        cap = math.inf
        if policy.robots is not None:
            cap = policy.robots.settings.crawl_delay_cap
            state = state_from_row(h._asdict())
            if needs_fetch(state, now):
                return self._lease_robots(tx, h, owner, now, expires, configured, policy)
            assert state is not None
            reason = _defer_reason(state, h.robots_failures, policy)
            if reason is not None:
                self._defer_host(tx, h.host_key, reason)
                return []
            if state.mode == robots.DISALLOW_ALL:
                return []  # unreachable robots.txt: wait for its retry (host backs off until)
        delay = effective_delay(
            configured, state.crawl_delay if state else h.crawl_delay, cap, h.latency_ewma, policy
        )
        allow = allowance(max_in_flight, h.error_streak)
        left = budget_left(h, now, policy)
        if left <= 0:
            self._defer_host(tx, h.host_key, "daily fetch budget exhausted")
            tx.bump("budget_exhausted", 1)
            return []
        # With a delay, one start per grant: a second grant now would break the spacing.
        take = int(min(room, allow - h.in_flight, 1 if delay > 0 else room, left))
        if take <= 0:
            return []
        picked: list[_PickedRow] = []
        while len(picked) < take:
            want = take - len(picked)
            # Exclude what is already picked: those rows are still 'queued' until the grant.
            rows = tx.cur.execute(
                f"SELECT {_URL_PICK_COLS} FROM urls "
                "WHERE host_key = %s AND state = 'queued' AND due_at <= %s "
                "AND kind <> 'robots' "
                "AND url_id <> ALL(%s::bigint[]) "
                "ORDER BY priority DESC, due_at LIMIT %s FOR UPDATE SKIP LOCKED",
                (
                    h.host_key,
                    now,
                    [p[0] for p in picked],
                    want + (16 if state is not None else 0),
                ),
            ).fetchall()
            if not rows:
                break
            refused: list[int] = []
            for r in rows:
                if (
                    state is None
                    or policy.robots is None
                    or policy.robots.allowed(h.host_key, state, r[1])
                ):
                    if len(picked) < take:
                        picked.append(r)
                else:
                    refused.append(r[0])
            if refused:
                assert policy.robots is not None
                tx.cur.execute(
                    "UPDATE urls SET state = 'disallowed', reason = %s "
                    "WHERE url_id = ANY(%s::bigint[])",
                    (f"robots.txt disallows {policy.robots.token}", refused),
                )
                tx.bump("robots_disallowed", len(refused))
            elif len(rows) <= want:
                break
        return self._grant(tx, h, picked, PAGE, owner, now, expires, delay, allow)

    def _lease_robots(
        self,
        tx: _Tx,
        h: _HostRow,
        owner: str,
        now: float,
        expires: float,
        delay: float,
        policy: HostPolicy,
    ) -> list[Lease]:
        """Queue (or requeue, as a new version) the host's robots.txt and lease it."""
        allow = allowance(
            h.max_in_flight if h.max_in_flight is not None else policy.max_in_flight,
            h.error_streak,
        )
        if h.in_flight >= allow:
            return []
        cur = tx.cur
        url = robots.robots_url(h.host_key)
        row = cur.execute(
            "SELECT url_id, state FROM urls WHERE url = %s FOR UPDATE SKIP LOCKED", (url,)
        ).fetchone()
        if row is None:
            inserted = cur.execute(
                "INSERT INTO urls (url, host_key, kind, state, due_at, discovered_at) "
                "VALUES (%s, %s, 'robots', 'queued', %s, %s) ON CONFLICT (url) DO NOTHING "
                "RETURNING url_id",
                (url, h.host_key, now, now),
            ).fetchone()
            if inserted is None:
                return []  # it exists but another transaction holds it right now
            url_id = int(inserted[0])
        elif row[1] == LEASED:
            return []  # already being fetched
        elif row[1] != QUEUED:
            url_id = int(row[0])
            cur.execute(
                "UPDATE urls SET state = 'queued', kind = 'robots', version = version + 1, "
                "due_at = %s, reason = NULL WHERE url_id = %s",
                (now, url_id),
            )
        else:
            url_id = int(row[0])
            cur.execute("UPDATE urls SET kind = 'robots' WHERE url_id = %s", (url_id,))
        r = cur.execute(
            f"SELECT {_URL_PICK_COLS} FROM urls WHERE url_id = %s", (url_id,)
        ).fetchone()
        assert r is not None
        return self._grant(tx, h, [r], ROBOTS, owner, now, expires, delay, allow)

    def _grant(
        self,
        tx: _Tx,
        h: _HostRow,
        rows: Sequence[_PickedRow],
        kind: str,
        owner: str,
        now: float,
        expires: float,
        delay: float,
        allow: int,
    ) -> list[Lease]:
        if not rows:
            return []
        leases = [
            lease_from_row(row, h.host_key, self._rng.getrandbits(62) or 1, owner, expires, kind)
            for row in rows
        ]
        ids = [ls.url_id for ls in leases]
        cur = tx.cur
        with self._batch(cur):
            cur.execute(
                "UPDATE urls AS u SET state = 'leased', lease_owner = %s, "
                "lease_token = g.token, lease_expires_at = %s, leased_at = %s "
                "FROM unnest(%s::bigint[], %s::bigint[]) AS g(url_id, token) "
                "WHERE u.url_id = g.url_id",
                (owner, expires, now, ids, [ls.token for ls in leases]),
            )
            cur.execute(
                "INSERT INTO lease_log (host_key, url_id, kind, granted_at, eligible_at, "
                "min_gap, allowance, in_flight_before) "
                "SELECT %s, g.url_id, g.kind, %s, g.eligible_at, %s, %s, %s + g.n - 1 "
                "FROM unnest(%s::bigint[], %s::float8[], %s::text[]) WITH ORDINALITY "
                "AS g(url_id, eligible_at, kind, n) ORDER BY g.n",
                (
                    h.host_key,
                    now,
                    delay,
                    allow,
                    h.in_flight,
                    ids,
                    [float(ls.due_at) for ls in leases],
                    [ls.kind for ls in leases],
                ),
            )
            day = budget_day(now)
            cur.execute(
                "UPDATE hosts SET next_allowed_at = %s, budget_used = CASE WHEN budget_day = %s "
                "THEN budget_used + %s ELSE %s END, budget_day = %s WHERE host_key = %s",
                (now + delay, day, len(leases), len(leases), day, h.host_key),
            )
        return leases

    @staticmethod
    def _defer_host(tx: _Tx, host_key: str, reason: str) -> None:
        tx.cur.execute(
            "UPDATE urls SET state = 'deferred', reason = %s "
            "WHERE host_key = %s AND state = 'queued' AND kind <> 'robots'",
            (reason, host_key),
        )
        tx.bump("urls_deferred", tx.cur.rowcount)

    def requeue_deferred(self) -> int:
        def tx_requeue(tx: _Tx) -> int:
            cur = tx.cur
            keys = cur.execute(
                "SELECT host_key FROM hosts WHERE robots_failures > 0 UNION "
                "SELECT DISTINCT host_key FROM urls WHERE state = 'deferred'"
            ).fetchall()
            self._lock_hosts(tx, (k[0] for k in keys))
            cur.execute("UPDATE hosts SET robots_failures = 0 WHERE robots_failures > 0")
            cur.execute("UPDATE urls SET state = 'queued', reason = NULL WHERE state = 'deferred'")
            return cur.rowcount

        return self._run(tx_requeue)

    def complete(
        self, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        if not completions:
            return []
        return self._run(lambda tx: self._complete(tx, completions, now, policy))

    def _complete(
        self, tx: _Tx, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        cur = tx.cur
        self._lock_hosts(
            tx,
            [c.lease.host_key for c in completions]
            + [u.host_key for c in completions for u in c.links],
        )
        # The lease fence for the whole batch in one statement. Within a batch only the first of
        # identical leases can be accepted (as in SQLite, where the second finds the URL done).
        first: dict[tuple[int, int, int], int] = {}
        for i, c in enumerate(completions):
            first.setdefault((c.lease.url_id, c.lease.version, c.lease.token), i)
        fenced = [completions[i] for i in first.values()]
        values = [done_values(c) for c in fenced]
        columns = [
            [None if v[i] is None else _DONE_CAST[col](v[i]) for v in values]
            for i, (col, _) in enumerate(DONE_COLUMNS)
        ]
        done = cur.execute(
            _DONE_SQL,
            (
                [c.lease.url_id for c in fenced],
                [c.lease.version for c in fenced],
                [c.lease.token for c in fenced],
                *columns,
            ),
        ).fetchall()
        ok_keys = {(int(r[0]), int(r[1]), int(r[2])) for r in done}
        accepted = [
            first[key] == i and key in ok_keys
            for i, key in enumerate(
                (c.lease.url_id, c.lease.version, c.lease.token) for c in completions
            )
        ]
        link_cursors: list[Cursor[Any]] = []
        with self._batch(cur):
            for c, ok in zip(completions, accepted, strict=True):
                if not ok:
                    continue
                ls = c.lease
                if ls.kind == ROBOTS:
                    # Store first: a Crawl-delay learnt here already spaces the next request.
                    self._store_robots(tx, ls.host_key, c, now, policy)
                    self._host_success(tx, ls.host_key, c.latency, now, policy)
                    continue
                self._host_success(tx, ls.host_key, c.latency, now, policy)
                if c.records:
                    cur.executemany(
                        _UPSERT_RECORD,
                        [
                            (
                                r.record_id,
                                r.source,
                                r.key,
                                ls.url,
                                r.data_json,
                                r.content_hash,
                                now,
                                now,
                            )
                            for r in c.records
                        ],
                    )
                if c.links:
                    lc = cur.connection.cursor()
                    self._insert_urls(_Tx(lc), c.links, now)
                    link_cursors.append(lc)
                if c.stored_body and c.payload_digest and c.warc_file is not None:
                    cur.execute(
                        "INSERT INTO bodies (payload_digest, url_id, url, warc_file, warc_offset, "
                        "warc_length, first_seen) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (payload_digest) DO NOTHING",
                        (
                            c.payload_digest,
                            ls.url_id,
                            ls.url,
                            c.warc_file,
                            c.warc_offset,
                            c.warc_length,
                            now,
                        ),
                    )
        pages = [
            c
            for c, ok in zip(completions, accepted, strict=True)
            if ok and c.lease.kind != ROBOTS
        ]
        for c in pages:
            if c.redirect_to is not None and self._redirect_loop(tx, c):
                cur.execute(
                    "UPDATE urls SET last_error = %s WHERE url_id = %s",
                    (f"redirect loop via {c.redirect_to}", c.lease.url_id),
                )
                tx.bump("redirect_loops", 1)
        # Sitemaps emit no event; a round that changed nothing (304, same body) neither.
        indexed = [c for c in pages if c.lease.kind in (PAGE, DOWNLOAD) and c.changed]
        if indexed:
            # Last in the transaction and held to COMMIT: ids are handed out in commit order.
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_EVENTS_LOCK,))
            cur.executemany(_INSERT_EVENT, [event_values(c, now) for c in indexed])
        links_new = 0
        for lc in link_cursors:
            links_new += max(lc.rowcount, 0)
            lc.close()
        tx.bump("url_duplicates", sum(len(c.links) for c in pages) - links_new)
        for name, n in completion_counters(pages).items():
            tx.bump(name, n)
        n_ok = sum(accepted)
        tx.bump("fetches", n_ok)
        tx.bump("completions_rejected", len(accepted) - n_ok)
        tx.bump("links_new", links_new)
        rejected: dict[str, int] = {}
        for c, ok in zip(completions, accepted, strict=True):
            if ok and c.lease.kind != ROBOTS:
                for reason, n in c.rejections.items():
                    rejected[reason] = rejected.get(reason, 0) + n
        for reason, n in sorted(rejected.items()):
            tx.bump(f"links_rejected_{reason}", n)
        return accepted

    @staticmethod
    def _redirect_loop(tx: _Tx, c: Completion) -> bool:
        def target_of(url: str) -> str | None:
            row = tx.cur.execute("SELECT redirect_to FROM urls WHERE url = %s", (url,)).fetchone()
            return row[0] if row else None

        return redirect_loop(c.lease.url, c.redirect_to, target_of)

    def _store_robots(
        self, tx: _Tx, host_key: str, c: Completion, now: float, policy: HostPolicy
    ) -> None:
        """Turn a robots.txt fetch into host state, keeping the last good copy (R7)."""
        if policy.robots is None or c.robots is None:
            return
        row = tx.cur.execute(
            f"SELECT {_HOST_COLS} FROM hosts WHERE host_key = %s", (host_key,)
        ).fetchone()
        assert row is not None
        h = _HostRow(*row)
        previous = state_from_row(h._asdict())
        rf = c.robots
        state = robots_outcome(
            rf.status,
            rf.body,
            now,
            policy.robots.settings,
            previous,
            error=rf.error,
            too_many_redirects=rf.too_many_redirects,
        )
        unreachable = state.last_error is not None and not (
            rf.status is not None and 200 <= rf.status < 500 and rf.status != 429
        )
        failures = h.robots_failures + 1 if unreachable else 0
        if rf.permanent:
            failures = max(failures, policy.robots_max_attempts)
        cols = state_to_row(state)
        tx.cur.execute(
            "UPDATE hosts SET robots_state = %s, robots_body = %s, robots_fetched_at = %s, "
            "robots_expires_at = %s, crawl_delay = %s, robots_meta = %s, robots_failures = %s "
            "WHERE host_key = %s",
            (
                cols["robots_state"],
                cols["robots_body"],
                cols["robots_fetched_at"],
                cols["robots_expires_at"],
                cols["crawl_delay"],
                cols["robots_meta"],
                failures,
                host_key,
            ),
        )
        tx.bump("robots_fetches", 1)
        own = sitemap_urls(state.sitemaps, host_key)
        if own:
            self._insert_urls(tx, own, now)
        reason = _defer_reason(state, failures, policy)
        if reason is not None:
            self._defer_host(tx, host_key, reason)
        elif state.mode == robots.DISALLOW_ALL:
            tx.cur.execute(
                "UPDATE hosts SET backoff_until = GREATEST(backoff_until, %s), "
                "backoff_reason = %s WHERE host_key = %s",
                (state.expires_at, f"robots.txt unreachable: {state.last_error}", host_key),
            )

    def fail(self, failures: Sequence[Failure], now: float, policy: HostPolicy) -> list[bool]:
        if not failures:
            return []
        return self._run(lambda tx: self._fail(tx, failures, now, policy))

    def _fail(
        self, tx: _Tx, failures: Sequence[Failure], now: float, policy: HostPolicy
    ) -> list[bool]:
        cur = tx.cur
        self._lock_hosts(tx, (f.lease.host_key for f in failures))
        accepted: list[bool] = []
        for f in failures:
            ls = f.lease
            # I3: check the fence before anything else, so a stale failure changes nothing, not
            # even the host's back-off (the SQLite backend backs off first; see the report).
            live = cur.execute(
                "SELECT 1 FROM urls WHERE url_id = %s AND state = 'leased' AND version = %s "
                "AND lease_token = %s FOR UPDATE",
                (ls.url_id, ls.version, ls.token),
            ).fetchone()
            if live is None:
                accepted.append(False)
                continue
            retry_at = f.retry_at
            if f.host_error:
                rest = self._host_error(tx, ls.host_key, f.retry_after, now, policy)
                if retry_at is not None:
                    retry_at = max(retry_at, now + rest)
            final = retry_at is None
            cur.execute(
                "UPDATE urls SET state = %s, due_at = %s, attempts = attempts + 1, "
                "last_error = %s, reason = %s, status_code = COALESCE(%s, status_code), "
                "warc_file = COALESCE(%s, warc_file), warc_offset = COALESCE(%s, warc_offset), "
                "warc_length = COALESCE(%s, warc_length), "
                "payload_digest = COALESCE(%s, payload_digest), "
                "lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL "
                "WHERE url_id = %s",
                (
                    FAILED if final else QUEUED,
                    now if final else retry_at,
                    f.error,
                    f.error if final else None,
                    f.status,
                    f.warc_file,
                    f.warc_offset,
                    f.warc_length,
                    f.payload_digest,
                    ls.url_id,
                ),
            )
            accepted.append(True)
            self._after_request(tx, ls.host_key, now, policy)
        n_ok = sum(accepted)
        tx.bump("fetches", n_ok)
        tx.bump("fetch_errors", n_ok)
        for f, ok in zip(failures, accepted, strict=True):
            cls = status_class(f.status) if ok else None
            if cls:
                tx.bump(f"status_{cls}", 1)
            if ok and f.retry_at is not None:
                tx.bump("retries", 1)
        tx.bump("completions_rejected", len(accepted) - n_ok)
        return accepted

    def _host_error(
        self, tx: _Tx, host_key: str, retry_after: float | None, now: float, policy: HostPolicy
    ) -> float:
        """Count an error against the host and back it off (R8); returns the rest in seconds."""
        row = tx.cur.execute(
            "SELECT error_streak FROM hosts WHERE host_key = %s", (host_key,)
        ).fetchone()
        assert row is not None
        streak = int(row[0]) + 1
        rest, reason = backoff_seconds(streak, retry_after, policy, self._rng)
        tx.cur.execute(
            "UPDATE hosts SET error_streak = %s, backoff_until = GREATEST(backoff_until, %s), "
            "backoff_reason = %s WHERE host_key = %s",
            (streak, now + rest, reason, host_key),
        )
        if streak == policy.breaker_threshold:
            tx.bump("breaker_trips", 1)
        tx.bump("host_backoffs", 1)
        return rest

    def _host_success(
        self, tx: _Tx, host_key: str, latency: float | None, now: float, policy: HostPolicy
    ) -> None:
        """SQLite's _host_success and _after_request as one statement (same formulas).

        The latency average comes from the row locked at the start of the transaction and is
        kept in ``tx.latency``, so no read is needed here and the batch can be pipelined.
        """
        new_latency: float | None = None
        if latency is not None:
            if host_key not in tx.latency:
                row = tx.cur.execute(
                    "SELECT latency_ewma FROM hosts WHERE host_key = %s", (host_key,)
                ).fetchone()
                tx.latency[host_key] = None if row is None else row[0]
            new_latency = update_latency(tx.latency[host_key], latency)
            tx.latency[host_key] = new_latency
        cap = policy.robots.settings.crawl_delay_cap if policy.robots is not None else -1.0
        tx.cur.execute(
            "UPDATE hosts SET latency_ewma = COALESCE(%s::float8, latency_ewma), "
            "error_streak = GREATEST(0, error_streak - 1), "
            "backoff_reason = CASE WHEN error_streak <= 1 THEN NULL ELSE backoff_reason END, "
            "next_allowed_at = GREATEST(next_allowed_at, %s + GREATEST(COALESCE(delay, %s), "
            "CASE WHEN crawl_delay <= %s THEN crawl_delay ELSE 0 END)) "
            "WHERE host_key = %s",
            (new_latency, now, policy.delay, cap, host_key),
        )

    @staticmethod
    def _after_request(tx: _Tx, host_key: str, now: float, p: HostPolicy) -> None:
        # I8: the delay (configured, or robots Crawl-delay within the cap) also separates the end
        # of one response from the next start.
        cap = p.robots.settings.crawl_delay_cap if p.robots is not None else -1.0
        tx.cur.execute(
            "UPDATE hosts SET next_allowed_at = GREATEST(next_allowed_at, %s + "
            "GREATEST(COALESCE(delay, %s), CASE WHEN crawl_delay <= %s THEN crawl_delay "
            "ELSE 0 END)) WHERE host_key = %s",
            (now, p.delay, cap, host_key),
        )

    def expire(self, now: float) -> int:
        return self._run(lambda tx: self._expire(tx, now))

    def _expire(self, tx: _Tx, now: float, *, skip_locked: bool = False) -> int:
        """Return expired leases to the queue (I7).

        Inside ``lease`` the hosts are taken with SKIP LOCKED so a leaser never waits: a host
        someone else holds right now is expired by the next call instead.
        """
        cur = tx.cur
        rows = cur.execute(
            "SELECT url_id, host_key FROM urls WHERE state = 'leased' AND lease_expires_at <= %s",
            (now,),
        ).fetchall()
        if not rows:
            return 0
        locked = self._lock_hosts(tx, (r[1] for r in rows), skip_locked=skip_locked)
        ids = [r[0] for r in rows if r[1] in locked]
        if not ids:
            return 0
        cur.execute(
            "UPDATE urls SET state = 'queued', due_at = %s, lease_owner = NULL, "
            "lease_token = NULL, lease_expires_at = NULL "
            "WHERE url_id = ANY(%s::bigint[]) AND state = 'leased' AND lease_expires_at <= %s",
            (now, ids, now),
        )
        n = max(cur.rowcount, 0)
        tx.bump("lease_expiries", n)
        return n

    def release_owner(self, owner: str) -> int:
        def tx_release(tx: _Tx) -> int:
            cur = tx.cur
            keys = cur.execute(
                "SELECT DISTINCT host_key FROM urls WHERE state = 'leased' AND lease_owner = %s",
                (owner,),
            ).fetchall()
            self._lock_hosts(tx, (k[0] for k in keys))
            cur.execute(
                "UPDATE urls SET state = 'queued', lease_owner = NULL, lease_token = NULL, "
                "lease_expires_at = NULL WHERE state = 'leased' AND lease_owner = %s",
                (owner,),
            )
            n = max(cur.rowcount, 0)
            tx.bump("leases_reclaimed", n)
            return n

        return self._run(tx_release)

    def schema_bytes(self) -> int:
        """Bytes on disk of this crawl's tables and indexes (for ``bench frontier``)."""
        row = self._run(
            lambda tx: tx.cur.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (self.schema,),
            ).fetchone(),
            write=False,
        )
        return int(row[0]) if row else 0

    def drop_schema(self) -> None:
        """Delete this crawl (its whole schema); used by benchmarks and tests."""
        self._run(
            lambda tx: tx.cur.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'),
        )

    def known_urls(self) -> Iterable[str]:
        rows = self._run(lambda tx: tx.cur.execute("SELECT url FROM urls").fetchall(), write=False)
        return [r[0] for r in rows]

    def owners_with_leases(self) -> list[str]:
        rows = self._run(
            lambda tx: tx.cur.execute(
                "SELECT DISTINCT lease_owner FROM urls WHERE state = 'leased'"
            ).fetchall(),
            write=False,
        )
        return [r[0] for r in rows if r[0]]

    def progress(self, now: float) -> Progress:
        # One statement, so one snapshot; the partial indexes make the two MINs cheap.
        row = self._run(
            lambda tx: tx.cur.execute(
                "WITH t AS (SELECT COALESCE(SUM(queued), 0) AS q, "
                "COALESCE(SUM(in_flight), 0) AS l, "
                "MIN(CASE WHEN queued > 0 THEN GREATEST(next_allowed_at, backoff_until) END) AS r "
                "FROM hosts) "
                "SELECT q, l, CASE WHEN q > 0 THEN "
                "(SELECT MIN(due_at) FROM urls WHERE state = 'queued') END, "
                "CASE WHEN l > 0 THEN "
                "(SELECT MIN(lease_expires_at) FROM urls WHERE state = 'leased') END, r, "
                "(SELECT MIN(next_fetch_at) FROM urls WHERE state = 'done') FROM t"
            ).fetchone(),
            write=False,
        )
        assert row is not None
        queued, leased, next_due, next_exp, host_ready, next_refetch = row
        return Progress(int(queued), int(leased), next_due, next_exp, host_ready, next_refetch)

    # -- recrawl, content dedup, live control ----------------------------------------------------

    def reschedule_due(self, now: float, limit: int) -> int:
        def tx_reschedule(tx: _Tx) -> int:
            cur = tx.cur
            rows = cur.execute(
                "SELECT url_id, host_key FROM urls WHERE state = 'done' AND next_fetch_at <= %s "
                "AND kind <> 'robots' ORDER BY next_fetch_at LIMIT %s",
                (now, limit),
            ).fetchall()
            if not rows:
                return 0
            self._lock_hosts(tx, {r[1] for r in rows})
            cur.execute(
                "UPDATE urls SET state = 'queued', version = version + 1, "
                "due_at = next_fetch_at, attempts = 0, reason = NULL "
                "WHERE url_id = ANY(%s::bigint[]) AND state = 'done'",
                ([r[0] for r in rows],),
            )
            n = max(cur.rowcount, 0)
            tx.bump("revisits", n)
            return n

        return self._run(tx_reschedule)

    def find_bodies(self, digests: Sequence[str]) -> dict[str, tuple[str, int, int, str]]:
        if not digests:
            return {}
        rows = self._run(
            lambda tx: tx.cur.execute(
                "SELECT payload_digest, warc_file, warc_offset, warc_length, url FROM bodies "
                "WHERE payload_digest = ANY(%s::text[])",
                (list(digests),),
            ).fetchall(),
            write=False,
        )
        return {r[0]: (r[1], int(r[2]), int(r[3]), r[4]) for r in rows}

    def body_digests(self) -> Iterable[str]:
        rows = self._run(
            lambda tx: tx.cur.execute("SELECT payload_digest FROM bodies").fetchall(), write=False
        )
        return [r[0] for r in rows]

    def simhashes(self) -> Iterable[tuple[int, int, int | None]]:
        rows = self._run(
            lambda tx: tx.cur.execute(
                "SELECT url_id, simhash, near_dup_of FROM urls WHERE simhash IS NOT NULL"
            ).fetchall(),
            write=False,
        )
        return [(int(u), int(h) & 0xFFFFFFFFFFFFFFFF, n) for u, h, n in rows]

    def reparse_candidates(
        self, where_failed: bool, after_id: int, limit: int
    ) -> list[dict[str, Any]]:
        where = "url_id > %s AND warc_file IS NOT NULL AND kind = 'page' AND " + (
            "state = 'failed' AND last_error LIKE 'parse%%'"
            if where_failed
            else "state IN ('done', 'failed')"
        )

        def tx_candidates(tx: _Tx) -> list[dict[str, Any]]:
            cur = tx.cur.execute(
                f"SELECT {REPARSE_COLS} FROM urls WHERE {where} ORDER BY url_id LIMIT %s",
                (after_id, limit),
            )
            cols = [d[0] for d in cur.description or ()]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

        return self._run(tx_candidates, write=False)

    def apply_reparse(self, items: Sequence[Reparsed], now: float) -> int:
        if not items:
            return 0

        def tx_apply(tx: _Tx) -> int:
            cur = tx.cur
            good = [it for it in items if it.error is None]
            links = [u for it in good for u in it.links]
            self._lock_hosts(tx, [u.host_key for u in links])
            records = [
                (r.record_id, r.source, r.key, it.url, r.data_json, r.content_hash, now, now)
                for it in good
                for r in it.records
            ]
            if records:
                cur.executemany(_UPSERT_RECORD, records)
            new = self._insert_urls(tx, links, now) if links else 0
            cur.execute(
                "UPDATE urls AS u SET state = CASE WHEN r.error IS NULL AND u.state = 'failed' "
                "THEN 'done' ELSE u.state END, last_error = r.error, "
                "reason = CASE WHEN r.error IS NULL THEN NULL ELSE u.reason END "
                "FROM unnest(%s::bigint[], %s::text[]) AS r(url_id, error) "
                "WHERE u.url_id = r.url_id",
                ([it.url_id for it in items], [it.error for it in items]),
            )
            tx.bump("reparsed", len(items))
            tx.bump("links_new", new)
            return len(records)

        return self._run(tx_apply)

    def eligibility_delay_histogram(self, bounds: Sequence[float]) -> dict[str, Any]:
        bounds = [float(b) for b in bounds if not math.isinf(b)]  # +inf is the total count
        delay = "GREATEST(0, granted_at - eligible_at)"
        cases = "".join(f"count(*) FILTER (WHERE {delay} <= %s), " for _ in bounds)
        row = self._run(
            lambda tx: tx.cur.execute(
                f"SELECT {cases}count(*), COALESCE(SUM({delay}), 0) FROM lease_log",
                [float(b) for b in bounds],
            ).fetchone(),
            write=False,
        )
        assert row is not None
        return {"counts": [int(x or 0) for x in row[:-1]], "sum": float(row[-1])}

    def recent_errors(self, limit: int) -> list[dict[str, Any]]:
        def tx_errors(tx: _Tx) -> list[dict[str, Any]]:
            cur = tx.cur.execute(
                "SELECT url, host_key, state, status_code, last_error, fetched_at FROM urls "
                "WHERE last_error IS NOT NULL ORDER BY COALESCE(fetched_at, due_at) DESC "
                "LIMIT %s",
                (limit,),
            )
            cols = [d[0] for d in cur.description or ()]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

        return self._run(tx_errors, write=False)

    def control(self, action: str, host_key: str | None = None, value: Any = None) -> int:
        stored = control_value(action, host_key, value)

        def tx_control(tx: _Tx) -> int:
            cur = tx.cur
            if host_key is None:
                cur.execute(
                    "INSERT INTO meta (key, value) VALUES ('paused', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    ("1" if action == "pause" else "0",),
                )
                return 1
            cur.execute(
                "INSERT INTO hosts (host_key) VALUES (%s) ON CONFLICT DO NOTHING", (host_key,)
            )
            self._lock_hosts(tx, [host_key])
            if action == "pause":
                cur.execute(
                    "UPDATE hosts SET paused = 1, pause_reason = 'paused by operator' "
                    "WHERE host_key = %s",
                    (host_key,),
                )
            elif action in ("resume", "unblock"):
                cur.execute(
                    "UPDATE hosts SET paused = 0, pause_reason = NULL WHERE host_key = %s",
                    (host_key,),
                )
                if action == "unblock":
                    cur.execute(
                        "UPDATE urls SET state = 'queued', reason = NULL WHERE host_key = %s "
                        "AND state = 'deferred' AND reason = 'blocked by operator'",
                        (host_key,),
                    )
            elif action == "block":
                cur.execute(
                    "UPDATE hosts SET paused = 1, pause_reason = 'blocked by operator' "
                    "WHERE host_key = %s",
                    (host_key,),
                )
                cur.execute(
                    "UPDATE urls SET state = 'deferred', reason = 'blocked by operator' "
                    "WHERE host_key = %s AND state = 'queued'",
                    (host_key,),
                )
                tx.bump("urls_deferred", max(cur.rowcount, 0))
            elif action == "set-delay":
                cur.execute("UPDATE hosts SET delay = %s WHERE host_key = %s", (stored, host_key))
            elif action == "set-budget":
                cur.execute(
                    "UPDATE hosts SET budget = %s WHERE host_key = %s",
                    (stored, host_key),
                )
            return 1

        return self._run(tx_control)

    def set_host_overrides(
        self, host_key: str, *, delay: float | None, max_in_flight: int | None
    ) -> None:
        self._run(
            lambda tx: tx.cur.execute(
                "INSERT INTO hosts (host_key, delay, max_in_flight) VALUES (%s, %s, %s) "
                "ON CONFLICT (host_key) DO UPDATE SET delay = excluded.delay, "
                "max_in_flight = excluded.max_in_flight",
                (host_key, delay, max_in_flight),
            )
        )

    def hosts_report(self, now: float) -> list[dict[str, Any]]:
        def tx_report(tx: _Tx) -> list[dict[str, Any]]:
            cur = tx.cur
            cur.execute(
                "SELECT host_key, queued, in_flight, max_in_flight, delay, next_allowed_at, "
                "backoff_until, backoff_reason, error_streak, latency_ewma, paused, robots_state, "
                "robots_fetched_at, robots_expires_at, crawl_delay, robots_meta, robots_failures "
                "FROM hosts ORDER BY host_key"
            )
            cols = [d.name for d in cur.description or ()]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

        out = []
        for r in self._run(tx_report, write=False):
            meta = json.loads(r.pop("robots_meta") or "{}")
            fetched = r.pop("robots_fetched_at")
            r["robots_age_s"] = None if fetched is None else round(now - fetched, 3)
            r["robots_last_error"] = meta.get("last_error")
            r["deferred_reason"] = meta.get("deferred_reason")
            r["in_backoff"] = r["backoff_until"] > now
            out.append(r)
        return out

    def lease_audit(self) -> dict[str, Any]:
        """Recheck every grant in the lease log against the allowance it was granted under."""

        def tx_audit(tx: _Tx) -> tuple[list[tuple[str, int]], list[float], int]:
            cur = tx.cur
            gap_or_slot = cur.execute(
                "SELECT host_key, count(*) FROM (SELECT host_key, granted_at, allowance, "
                "in_flight_before, LAG(granted_at) OVER w AS prev_at, "
                "LAG(min_gap) OVER w AS prev_gap FROM lease_log "
                "WINDOW w AS (PARTITION BY host_key ORDER BY granted_at, id)) AS g "
                "WHERE in_flight_before >= allowance OR granted_at < prev_at + prev_gap - 1e-6 "
                "GROUP BY host_key"
            ).fetchall()
            delays = [
                r[0]
                for r in cur.execute(
                    "SELECT GREATEST(0, granted_at - eligible_at) FROM lease_log "
                    "ORDER BY id DESC LIMIT 100000"
                ).fetchall()
            ]
            grants = cur.execute("SELECT count(*) FROM lease_log").fetchone()
            return (
                [(r[0], int(r[1])) for r in gap_or_slot],
                delays,
                int(grants[0]) if grants else 0,
            )

        gap_or_slot, delays, grants = self._run(tx_audit, write=False, snapshot=True)
        delays.sort()

        def pct(p: float) -> float | None:
            if not delays:
                return None
            return round(delays[min(len(delays) - 1, int(p * len(delays)))], 4)

        return {
            "grants": grants,
            "violations": sum(n for _, n in gap_or_slot),
            "violations_by_host": dict(gap_or_slot),
            "eligibility_delay_s": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)},
        }

    def stats(self) -> FrontierStats:
        def tx_stats(tx: _Tx) -> FrontierStats:
            cur = tx.cur

            def scalar(query: str) -> int:
                row = cur.execute(query).fetchone()
                return int(row[0]) if row else 0

            by_state = dict.fromkeys(STATES, 0)
            by_state.update(
                (r[0], int(r[1]))
                for r in cur.execute("SELECT state, count(*) FROM urls GROUP BY state").fetchall()
            )
            return FrontierStats(
                urls_by_state=by_state,
                hosts=scalar("SELECT count(*) FROM hosts"),
                records=scalar("SELECT count(*) FROM records"),
                events=scalar("SELECT count(*) FROM events"),
                counters={
                    r[0]: int(r[1])
                    for r in cur.execute("SELECT name, value FROM counters").fetchall()
                },
                meta=dict(cur.execute("SELECT key, value FROM meta").fetchall()),
            )

        return self._run(tx_stats, write=False, snapshot=True)

    def get_meta(self, key: str) -> str | None:
        row = self._run(
            lambda tx: tx.cur.execute("SELECT value FROM meta WHERE key = %s", (key,)).fetchone(),
            write=False,
        )
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._run(
            lambda tx: tx.cur.execute(
                "INSERT INTO meta (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )
        )

    def add_seeds(self, host_keys: Iterable[str]) -> None:
        keys = list(host_keys)
        if not keys:
            return
        self._run(
            lambda tx: tx.cur.execute(
                "INSERT INTO seeds (host_key) SELECT unnest(%s::text[]) "
                "ON CONFLICT (host_key) DO NOTHING",
                (keys,),
            )
        )

    def seed_hosts(self) -> frozenset[str]:
        rows = self._run(
            lambda tx: tx.cur.execute("SELECT host_key FROM seeds").fetchall(), write=False
        )
        return frozenset(r[0] for r in rows)

    def records(self) -> Iterator[dict[str, Any]]:
        """Every stored record, ordered by source and key (read at once, like SQLite's)."""
        cols = (
            "record_id",
            "source",
            "key",
            "url",
            "data",
            "content_hash",
            "first_seen",
            "last_changed",
        )
        rows = self._run(
            lambda tx: tx.cur.execute(
                f"SELECT {', '.join(cols)} FROM records ORDER BY source, key"
            ).fetchall(),
            write=False,
        )
        return (dict(zip(cols, row, strict=True)) for row in rows)

    def _row(self, table: str, column: str, value: str) -> dict[str, Any] | None:
        def tx_row(tx: _Tx) -> dict[str, Any] | None:
            cur = tx.cur
            cur.execute(
                sql.SQL("SELECT * FROM {} WHERE {} = %s").format(
                    sql.Identifier(table), sql.Identifier(column)
                ),
                (value,),
            )
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d.name for d in cur.description or ()], row, strict=True))

        return self._run(tx_row, write=False)

    def url_row(self, url: str) -> dict[str, Any] | None:
        """One URL's full row (for tests, status and debugging)."""
        return self._row("urls", "url", url)

    def host_row(self, host_key: str) -> dict[str, Any] | None:
        return self._row("hosts", "host_key", host_key)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    # -- outputs: events and exports --
    # Read side of R21/R22, the same semantics as the SQLite backend's section. Streams page
    # through the primary key (keyset), one short read-only transaction per batch: nothing holds
    # a transaction open for a whole export, and a lost connection retries only the batch. Event
    # ids are assigned in commit order (see complete), so ``event_id > cursor`` skips nothing.

    _EVENT_COLS = (
        "event_id, url_id, url_version, url, status, fetched_at, content_hash, records, links, "
        "warc_file, warc_offset, warc_length, payload_digest, created_at"
    )
    _URL_COLS = (
        "url_id, url, state, reason, kind, version, status_code, fetched_at, body_bytes, "
        "content_hash, depth, next_fetch_at"
    )
    _RECORD_COLS = "record_id, source, key, url, data, content_hash, first_seen, last_changed"

    def _dicts(self, query: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        def tx_dicts(tx: _Tx) -> list[dict[str, Any]]:
            cur = tx.cur
            cur.execute(query, params)
            cols = [d.name for d in cur.description or ()]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

        return self._run(tx_dicts, write=False)

    def _keyset(
        self, table: str, cols: str, key: str, start: Any, batch: int
    ) -> Iterator[dict[str, Any]]:
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        last = start
        while True:
            rows = self._dicts(
                f"SELECT {cols} FROM {table} WHERE {key} > %s ORDER BY {key} LIMIT %s",
                (last, batch),
            )
            yield from rows
            if len(rows) < batch:
                return
            last = rows[-1][key]

    def events_after(self, cursor: int, limit: int) -> list[dict[str, Any]]:
        if limit <= 0:
            return []
        return self._dicts(
            f"SELECT {self._EVENT_COLS} FROM events WHERE event_id > %s "
            "ORDER BY event_id LIMIT %s",
            (cursor, limit),
        )

    def get_cursor(self, consumer: str) -> int:
        row = self._run(
            lambda tx: tx.cur.execute(
                "SELECT cursor FROM deliveries WHERE consumer = %s", (consumer,)
            ).fetchone(),
            write=False,
        )
        return int(row[0]) if row else 0

    def set_cursor(self, consumer: str, cursor: int) -> None:
        # Idempotent (keeps the maximum), so running it again after a lost COMMIT is harmless.
        self._run(
            lambda tx: tx.cur.execute(
                "INSERT INTO deliveries (consumer, cursor) VALUES (%s, %s) "
                "ON CONFLICT (consumer) DO UPDATE "
                "SET cursor = GREATEST(deliveries.cursor, excluded.cursor)",
                (consumer, cursor),
            )
        )

    def iter_urls(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("urls", self._URL_COLS, "url_id", 0, batch)

    def iter_events(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("events", self._EVENT_COLS, "event_id", 0, batch)

    def iter_records(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("records", self._RECORD_COLS, "record_id", "", batch)

    def aggregates(self) -> dict[str, Any]:
        def tx_aggregates(tx: _Tx) -> dict[str, Any]:
            cur = tx.cur
            by_state = dict.fromkeys(STATES, 0)
            by_state.update(
                (r[0], int(r[1]))
                for r in cur.execute("SELECT state, count(*) FROM urls GROUP BY state").fetchall()
            )
            by_status = {
                int(r[0]): int(r[1])
                for r in cur.execute(
                    "SELECT status_code, count(*) FROM urls WHERE status_code IS NOT NULL "
                    "GROUP BY status_code ORDER BY status_code"
                ).fetchall()
            }
            row = cur.execute(
                "SELECT count(fetched_at), COALESCE(SUM(body_bytes), 0)::bigint FROM urls"
            ).fetchone()
            fetched, body_bytes = (int(row[0]), int(row[1])) if row else (0, 0)
            by_source = {
                r[0]: int(r[1])
                for r in cur.execute(
                    "SELECT source, count(*) FROM records GROUP BY source ORDER BY source"
                ).fetchall()
            }
            events = cur.execute("SELECT count(*) FROM events").fetchone()
            return {
                "urls": sum(by_state.values()),
                "urls_by_state": by_state,
                "fetched": fetched,
                "status_codes": by_status,
                "body_bytes": body_bytes,
                "records": sum(by_source.values()),
                "records_by_source": by_source,
                "events": int(events[0]) if events else 0,
            }

        return self._run(tx_aggregates, write=False, snapshot=True)
