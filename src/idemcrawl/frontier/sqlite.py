"""The embedded SQLite frontier: one file, WAL, zero set-up.

Why these settings:

* ``journal_mode=WAL`` lets ``status``/``export`` read while a crawl writes, and makes a commit
  one sequential append.
* ``synchronous=NORMAL``: in WAL mode a committed transaction survives a process kill (SIGKILL)
  because it is in the OS page cache; only a power loss can drop the last commits. Our promise is
  about process death, and FULL would cost one fsync per group commit.
* Every write transaction is ``BEGIN IMMEDIATE`` so several ``idemcrawl crawl`` processes on one
  file serialise their grants instead of failing with SQLITE_BUSY half-way (busy_timeout waits).
* ``hosts.in_flight`` and ``hosts.queued`` are maintained by triggers on ``urls.state`` so the host
  token state can never drift from the URL states it summarises (invariant I6).
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .base import (
    FAILED,
    QUEUED,
    STATES,
    Completion,
    Failure,
    FrontierError,
    FrontierStats,
    HostPolicy,
    Lease,
    NewURL,
    Progress,
)

SCHEMA_VERSION = 1

# The schema covers the whole SPEC; later features fill in columns that are already here.
MIGRATIONS: list[str] = [
    """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL DEFAULT 0);
CREATE TABLE seeds (host_key TEXT PRIMARY KEY);

-- Level 1 of scheduling: one row per host_key with its token state (R6-R8, R17).
CREATE TABLE hosts (
    host_key        TEXT PRIMARY KEY,
    next_allowed_at REAL    NOT NULL DEFAULT 0,   -- earliest next request start
    in_flight       INTEGER NOT NULL DEFAULT 0,   -- = count of its leased URLs (triggers)
    queued          INTEGER NOT NULL DEFAULT 0,   -- = count of its queued URLs (triggers)
    max_in_flight   INTEGER,                      -- NULL: global default
    delay           REAL,                         -- NULL: global default
    backoff_until   REAL    NOT NULL DEFAULT 0,
    error_streak    INTEGER NOT NULL DEFAULT 0,
    latency_ewma    REAL,
    paused          INTEGER NOT NULL DEFAULT 0,
    pause_reason    TEXT,
    robots_state    TEXT,                         -- NULL unknown / ok / allow_all / disallow_all
    robots_body     BLOB,
    robots_fetched_at REAL,
    robots_expires_at REAL,
    crawl_delay     REAL,
    budget_day      TEXT,
    budget_used     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX hosts_ready ON hosts(next_allowed_at) WHERE queued > 0;

-- Level 2: the URLs, their state machine and version (R2, R4, R13-R16).
CREATE TABLE urls (
    url_id           INTEGER PRIMARY KEY,
    url              TEXT    NOT NULL UNIQUE,     -- normalised; the durable dedup key (R10)
    host_key         TEXT    NOT NULL,
    state            TEXT    NOT NULL DEFAULT 'queued',
    reason           TEXT,                        -- why rejected / failed
    version          INTEGER NOT NULL DEFAULT 1,  -- bumped by each recrawl round (R4)
    priority         INTEGER NOT NULL DEFAULT 0,
    depth            INTEGER NOT NULL DEFAULT 0,
    due_at           REAL    NOT NULL DEFAULT 0,
    discovered_at    REAL    NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_token      INTEGER,
    lease_expires_at REAL,
    leased_at        REAL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    status_code      INTEGER,
    fetched_at       REAL,
    body_bytes       INTEGER,
    content_hash     TEXT,
    simhash          INTEGER,
    etag             TEXT,
    last_modified    TEXT,
    next_fetch_at    REAL,
    revisit_interval REAL,
    canonical_hint   TEXT,
    warc_file        TEXT,
    warc_offset      INTEGER,
    warc_length      INTEGER,
    payload_digest   TEXT
);
CREATE INDEX urls_queue ON urls(host_key, priority DESC, due_at) WHERE state = 'queued';
CREATE INDEX urls_leases ON urls(lease_expires_at) WHERE state = 'leased';
CREATE INDEX urls_state ON urls(state);

CREATE TRIGGER urls_insert AFTER INSERT ON urls BEGIN
    INSERT OR IGNORE INTO hosts(host_key) VALUES (NEW.host_key);
    UPDATE hosts SET queued = queued + (NEW.state = 'queued'),
                     in_flight = in_flight + (NEW.state = 'leased')
     WHERE host_key = NEW.host_key;
END;
CREATE TRIGGER urls_state AFTER UPDATE OF state ON urls WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE hosts SET queued = queued + (NEW.state = 'queued') - (OLD.state = 'queued'),
                     in_flight = in_flight + (NEW.state = 'leased') - (OLD.state = 'leased')
     WHERE host_key = NEW.host_key;
END;

-- Records with derived ids (R1).
CREATE TABLE records (
    record_id    TEXT PRIMARY KEY,                -- H(source, key), 128 bits
    source       TEXT NOT NULL,
    key          TEXT NOT NULL,
    url          TEXT NOT NULL,
    data         TEXT NOT NULL,                   -- canonical JSON
    content_hash TEXT NOT NULL,
    first_seen   REAL NOT NULL,
    last_changed REAL NOT NULL
);

-- Exactly-once index events (R21): the cursor is event_id.
CREATE TABLE events (
    event_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    url_id       INTEGER NOT NULL,
    url_version  INTEGER NOT NULL,
    url          TEXT    NOT NULL,
    status       INTEGER,
    fetched_at   REAL,
    content_hash TEXT,
    records      INTEGER NOT NULL DEFAULT 0,
    links        INTEGER NOT NULL DEFAULT 0,
    warc_file    TEXT,
    warc_offset  INTEGER,
    warc_length  INTEGER,
    created_at   REAL    NOT NULL,
    UNIQUE (url_id, url_version)
);
CREATE TABLE deliveries (consumer TEXT PRIMARY KEY, cursor INTEGER NOT NULL DEFAULT 0);

-- Partition ownership with fencing epochs (R25).
CREATE TABLE partitions (
    partition  INTEGER PRIMARY KEY,
    owner      TEXT,
    epoch      INTEGER NOT NULL DEFAULT 0,
    expires_at REAL    NOT NULL DEFAULT 0
);
""",
]

_BUSY_TIMEOUT_MS = 60_000


class SQLiteFrontier:
    """Frontier backend on one SQLite file; safe to share between processes on one machine."""

    def __init__(self, path: str, *, create: bool = True) -> None:
        self.path = path
        if not create and not os.path.exists(path):
            raise FrontierError(f"no crawl database at {path!r}")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise FrontierError(f"cannot create database {path!r}: directory {parent!r} missing")
        try:
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1e3
            )
            self._db.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=OFF")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise FrontierError(f"cannot open crawl database {path!r}: {exc}") from exc
        self._lock = threading.Lock()
        self._rng = random.Random()

    # -- plumbing -------------------------------------------------------------------------------

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise FrontierError(
                f"database {self.path!r} has schema version {version}, newer than this idemcrawl "
                f"({SCHEMA_VERSION}); upgrade idemcrawl"
            )
        if version == 0:
            tables = self._db.execute(
                "SELECT count(*) FROM sqlite_master WHERE type='table'"
            ).fetchone()[0]
            if tables:
                raise FrontierError(f"{self.path!r} is an SQLite file but not an idemcrawl crawl")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self._db.execute("BEGIN IMMEDIATE")
            for stmt in _split_sql(MIGRATIONS[target - 1]):
                self._db.execute(stmt)
            self._db.execute(f"PRAGMA user_version={target}")
            self._db.execute("COMMIT")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")

    @staticmethod
    def _bump(db: sqlite3.Connection, name: str, n: int) -> None:
        if n:
            db.execute(
                "INSERT INTO counters(name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (name, n),
            )

    # -- contract -------------------------------------------------------------------------------

    def add(self, urls: Iterable[NewURL], now: float) -> int:
        rows = [(u.url, u.host_key, u.state, u.reason, u.priority, u.depth, now, now) for u in urls]
        if not rows:
            return 0
        with self._tx() as db:
            return self._insert_urls(db, rows)

    @staticmethod
    def _insert_urls(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
        # rowcount of executemany sums sqlite3_changes(), which excludes trigger writes.
        return db.executemany(
            "INSERT OR IGNORE INTO urls(url, host_key, state, reason, priority, depth, due_at, "
            "discovered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        ).rowcount

    def lease(
        self, owner: str, limit: int, now: float, lease_seconds: float, policy: HostPolicy
    ) -> list[Lease]:
        if limit <= 0:
            return []
        with self._tx() as db:
            self._expire(db, now)
            hosts = db.execute(
                "SELECT host_key, in_flight, COALESCE(max_in_flight, ?), COALESCE(delay, ?) "
                "FROM hosts WHERE queued > 0 AND next_allowed_at <= ? AND backoff_until <= ? "
                "AND paused = 0 AND in_flight < COALESCE(max_in_flight, ?) "
                "ORDER BY next_allowed_at LIMIT ?",
                (policy.max_in_flight, policy.delay, now, now, policy.max_in_flight, limit),
            ).fetchall()
            leases: list[Lease] = []
            expires = now + lease_seconds
            for host_key, in_flight, max_in_flight, delay in hosts:
                room = limit - len(leases)
                if room <= 0:
                    break
                # With a delay, one start per grant: a second grant now would break the spacing.
                take = min(room, max_in_flight - in_flight, 1 if delay > 0 else room)
                rows = db.execute(
                    "SELECT url_id, url, version, depth, attempts FROM urls "
                    "WHERE host_key = ? AND state = 'queued' AND due_at <= ? "
                    "ORDER BY priority DESC, due_at LIMIT ?",
                    (host_key, now, take),
                ).fetchall()
                if not rows:
                    continue
                grants = []
                for url_id, url, version, depth, attempts in rows:
                    token = self._rng.getrandbits(62) or 1
                    grants.append((owner, token, expires, now, url_id))
                    leases.append(
                        Lease(
                            url_id, url, host_key, version, token, owner, expires, depth, attempts
                        )
                    )
                db.executemany(
                    "UPDATE urls SET state = 'leased', lease_owner = ?, lease_token = ?, "
                    "lease_expires_at = ?, leased_at = ? WHERE url_id = ?",
                    grants,
                )
                db.execute(
                    "UPDATE hosts SET next_allowed_at = ? WHERE host_key = ?",
                    (now + delay, host_key),
                )
            self._bump(db, "leases_granted", len(leases))
            return leases

    def complete(
        self, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        accepted: list[bool] = []
        if not completions:
            return accepted
        with self._tx() as db:
            links_new = 0
            for c in completions:
                ls = c.lease
                cur = db.execute(
                    "UPDATE urls SET state = 'done', status_code = ?, fetched_at = ?, "
                    "content_hash = ?, body_bytes = ?, last_error = ?, lease_owner = NULL, "
                    "lease_token = NULL, lease_expires_at = NULL "
                    "WHERE url_id = ? AND state = 'leased' AND version = ? AND lease_token = ?",
                    (
                        c.status,
                        c.fetched_at,
                        c.content_hash,
                        c.body_bytes,
                        c.error,
                        ls.url_id,
                        ls.version,
                        ls.token,
                    ),
                )
                if cur.rowcount != 1:
                    accepted.append(False)
                    continue
                accepted.append(True)
                self._after_request(db, ls.host_key, now, policy)
                if c.records:
                    db.executemany(
                        "INSERT INTO records(record_id, source, key, url, data, content_hash, "
                        "first_seen, last_changed) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT(record_id) DO UPDATE SET data = excluded.data, "
                        "content_hash = excluded.content_hash, "
                        "last_changed = excluded.last_changed, url = excluded.url "
                        "WHERE records.content_hash IS NOT excluded.content_hash",
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
                    links_new += self._insert_urls(
                        db,
                        [
                            (u.url, u.host_key, u.state, u.reason, u.priority, u.depth, now, now)
                            for u in c.links
                        ],
                    )
                db.execute(
                    "INSERT INTO events(url_id, url_version, url, status, fetched_at, "
                    "content_hash, records, links, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(url_id, url_version) DO NOTHING",
                    (
                        ls.url_id,
                        ls.version,
                        ls.url,
                        c.status,
                        c.fetched_at,
                        c.content_hash,
                        len(c.records),
                        len(c.links),
                        now,
                    ),
                )
            n_ok = sum(accepted)
            self._bump(db, "fetches", n_ok)
            self._bump(db, "completions_rejected", len(accepted) - n_ok)
            self._bump(db, "links_new", links_new)
        return accepted

    def fail(self, failures: Sequence[Failure], now: float, policy: HostPolicy) -> list[bool]:
        accepted: list[bool] = []
        if not failures:
            return accepted
        with self._tx() as db:
            for f in failures:
                ls = f.lease
                final = f.retry_at is None
                cur = db.execute(
                    "UPDATE urls SET state = ?, due_at = ?, attempts = attempts + 1, "
                    "last_error = ?, reason = ?, status_code = COALESCE(?, status_code), "
                    "lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL "
                    "WHERE url_id = ? AND state = 'leased' AND version = ? AND lease_token = ?",
                    (
                        FAILED if final else QUEUED,
                        now if final else f.retry_at,
                        f.error,
                        f.error if final else None,
                        f.status,
                        ls.url_id,
                        ls.version,
                        ls.token,
                    ),
                )
                ok = cur.rowcount == 1
                accepted.append(ok)
                if ok:
                    self._after_request(db, ls.host_key, now, policy)
            n_ok = sum(accepted)
            self._bump(db, "fetches", n_ok)
            self._bump(db, "fetch_errors", n_ok)
            self._bump(db, "completions_rejected", len(accepted) - n_ok)
        return accepted

    @staticmethod
    def _after_request(db: sqlite3.Connection, host_key: str, now: float, p: HostPolicy) -> None:
        # I8: the delay also separates the end of one response from the next start.
        db.execute(
            "UPDATE hosts SET next_allowed_at = MAX(next_allowed_at, ? + COALESCE(delay, ?)) "
            "WHERE host_key = ?",
            (now, p.delay, host_key),
        )

    def expire(self, now: float) -> int:
        with self._tx() as db:
            return self._expire(db, now)

    def _expire(self, db: sqlite3.Connection, now: float) -> int:
        n = db.execute(
            "UPDATE urls SET state = 'queued', due_at = ?, lease_owner = NULL, lease_token = NULL, "
            "lease_expires_at = NULL WHERE state = 'leased' AND lease_expires_at <= ?",
            (now, now),
        ).rowcount
        self._bump(db, "lease_expiries", n)
        return n

    def release_owner(self, owner: str) -> int:
        with self._tx() as db:
            n = db.execute(
                "UPDATE urls SET state = 'queued', lease_owner = NULL, lease_token = NULL, "
                "lease_expires_at = NULL WHERE state = 'leased' AND lease_owner = ?",
                (owner,),
            ).rowcount
            self._bump(db, "leases_reclaimed", n)
            return n

    def owners_with_leases(self) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT lease_owner FROM urls WHERE state = 'leased'"
            ).fetchall()
        return [r[0] for r in rows if r[0]]

    def progress(self, now: float) -> Progress:
        with self._lock:
            queued, leased, host_ready = self._db.execute(
                "SELECT COALESCE(SUM(queued), 0), COALESCE(SUM(in_flight), 0), "
                "MIN(CASE WHEN queued > 0 THEN MAX(next_allowed_at, backoff_until) END) FROM hosts"
            ).fetchone()
            next_due = (
                self._db.execute("SELECT MIN(due_at) FROM urls WHERE state = 'queued'").fetchone()[
                    0
                ]
                if queued
                else None
            )
            next_exp = (
                self._db.execute(
                    "SELECT MIN(lease_expires_at) FROM urls WHERE state = 'leased'"
                ).fetchone()[0]
                if leased
                else None
            )
        return Progress(queued, leased, next_due, next_exp, host_ready)

    def stats(self) -> FrontierStats:
        with self._lock:
            db = self._db
            by_state = dict.fromkeys(STATES, 0)
            by_state.update(
                db.execute("SELECT state, count(*) FROM urls GROUP BY state").fetchall()
            )
            return FrontierStats(
                urls_by_state=by_state,
                hosts=db.execute("SELECT count(*) FROM hosts").fetchone()[0],
                records=db.execute("SELECT count(*) FROM records").fetchone()[0],
                events=db.execute("SELECT count(*) FROM events").fetchone()[0],
                counters=dict(db.execute("SELECT name, value FROM counters").fetchall()),
                meta=dict(db.execute("SELECT key, value FROM meta").fetchall()),
            )

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def add_seeds(self, host_keys: Iterable[str]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT OR IGNORE INTO seeds(host_key) VALUES (?)", [(h,) for h in host_keys]
            )

    def seed_hosts(self) -> frozenset[str]:
        with self._lock:
            return frozenset(r[0] for r in self._db.execute("SELECT host_key FROM seeds"))

    def records(self) -> Iterable[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT record_id, source, key, url, data, content_hash, first_seen, last_changed "
                "FROM records ORDER BY source, key"
            ).fetchall()
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
        for row in rows:
            yield dict(zip(cols, row, strict=True))

    def url_row(self, url: str) -> dict[str, Any] | None:
        """One URL's full row (for tests, status and debugging)."""
        with self._lock:
            cur = self._db.execute("SELECT * FROM urls WHERE url = ?", (url,))
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d[0] for d in cur.description], row, strict=True))

    def host_row(self, host_key: str) -> dict[str, Any] | None:
        with self._lock:
            cur = self._db.execute("SELECT * FROM hosts WHERE host_key = ?", (host_key,))
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d[0] for d in cur.description], row, strict=True))

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies (which contain ';') whole."""
    out: list[str] = []
    buf: list[str] = []
    for line in script.splitlines():
        if not line.strip() or line.strip().startswith("--"):
            continue
        buf.append(line)
        text = "\n".join(buf)
        if sqlite3.complete_statement(text):
            out.append(text)
            buf = []
    if buf:
        out.append("\n".join(buf))
    return out
