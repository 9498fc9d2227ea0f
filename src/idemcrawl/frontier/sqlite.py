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

import json
import math
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from .. import robots
from ..politeness import (
    LATENCY_ALPHA,
    MAX_STREAK_SHIFT,
    allowance,
    backoff_seconds,
    effective_delay,
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

SCHEMA_VERSION = 3

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
    # 2: robots.txt as a URL kind, host back-off reasons, the politeness audit log (issue 3).
    """
ALTER TABLE urls ADD COLUMN kind TEXT NOT NULL DEFAULT 'page';
ALTER TABLE hosts ADD COLUMN robots_meta TEXT;
ALTER TABLE hosts ADD COLUMN robots_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN backoff_reason TEXT;
-- One row per granted lease: what the grant saw and promised, so politeness can be re-checked
-- from stored facts (status, metrics) and eligibility delay measured.
CREATE TABLE lease_log (
    id               INTEGER PRIMARY KEY,
    host_key         TEXT    NOT NULL,
    url_id           INTEGER NOT NULL,
    kind             TEXT    NOT NULL,
    granted_at       REAL    NOT NULL,
    eligible_at      REAL    NOT NULL,
    min_gap          REAL    NOT NULL,
    allowance        INTEGER NOT NULL,
    in_flight_before INTEGER NOT NULL
);
CREATE INDEX lease_log_host ON lease_log(host_key, granted_at);
""",
    # 3: recrawl rounds, redirects, content dedup, per-host budgets (issues 4, 5, 6).
    """
ALTER TABLE urls ADD COLUMN hops INTEGER NOT NULL DEFAULT 0;
ALTER TABLE urls ADD COLUMN redirect_to TEXT;
ALTER TABLE urls ADD COLUMN near_dup_of INTEGER;
ALTER TABLE urls ADD COLUMN stored_file TEXT;
ALTER TABLE hosts ADD COLUMN budget INTEGER;
ALTER TABLE events ADD COLUMN payload_digest TEXT;
-- What a --recrawl run looks for, and what progress() asks for, without scanning.
CREATE INDEX urls_refetch ON urls(next_fetch_at) WHERE state = 'done';
CREATE INDEX urls_due ON urls(due_at) WHERE state = 'queued';
-- Byte-identical bodies are archived once (R11): later copies point at this response record.
CREATE TABLE bodies (
    payload_digest TEXT PRIMARY KEY,
    url_id         INTEGER NOT NULL,
    url            TEXT    NOT NULL,
    warc_file      TEXT    NOT NULL,
    warc_offset    INTEGER NOT NULL,
    warc_length    INTEGER NOT NULL,
    first_seen     REAL    NOT NULL
);
""",
]

_BUSY_TIMEOUT_MS = 60_000

_UPSERT_RECORD = (
    "INSERT INTO records(record_id, source, key, url, data, content_hash, first_seen, "
    "last_changed) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(record_id) DO UPDATE SET data = excluded.data, "
    "content_hash = excluded.content_hash, last_changed = excluded.last_changed, "
    "url = excluded.url WHERE records.content_hash IS NOT excluded.content_hash"
)

#: What reparse needs of a URL (``reparse_candidates``).
REPARSE_COLS = (
    "url_id, url, version, depth, kind, state, status_code, last_error, warc_file, "
    "warc_offset, warc_length, payload_digest"
)

#: SET clause of the fenced completion update (parameters: ``done_values``).
_DONE_SET = ", ".join(
    f"{col} = COALESCE(?, {col})" if keep else f"{col} = ?" for col, keep in DONE_COLUMNS
) + (
    ", state = 'done', attempts = 0, lease_owner = NULL, lease_token = NULL, "
    "lease_expires_at = NULL"
)


class _HostRow(NamedTuple):
    host_key: str
    in_flight: int
    max_in_flight: int | None
    delay: float | None
    error_streak: int
    latency_ewma: float | None
    robots_state: str | None
    robots_body: bytes | None
    robots_fetched_at: float | None
    robots_expires_at: float | None
    crawl_delay: float | None
    robots_meta: str | None
    robots_failures: int
    budget_day: str | None
    budget_used: int
    budget: int | None


_HOST_COLS = ", ".join(_HostRow._fields)


def _defer_reason(state: RobotsState, failures: int, policy: HostPolicy) -> str | None:
    """Why a host's pages cannot be crawled in this run at all, if they cannot."""
    if state.deferred_reason:
        return state.deferred_reason
    if state.mode == robots.DISALLOW_ALL and failures >= policy.robots_max_attempts:
        return f"robots.txt unreachable after {failures} attempts: {state.last_error}"
    return None


def budget_day(now: float) -> str:
    """The UTC day a per-host fetch budget counts against (R17)."""
    return time.strftime("%Y-%m-%d", time.gmtime(now))


def budget_left(h: Any, now: float, policy: HostPolicy) -> float:
    """Fetches the host may still start today (inf without a budget)."""
    budget = h.budget if h.budget is not None else policy.daily_budget
    if budget is None:
        return math.inf
    used = h.budget_used if h.budget_day == budget_day(now) else 0
    return max(0, budget - used)


#: Columns a lease carries (Lease fields after ``kind``, in order).
PICK_COLS = (
    "url_id, url, version, depth, attempts, due_at, kind, etag, last_modified, content_hash, "
    "status_code, revisit_interval, hops"
)


def lease_from_row(
    row: Sequence[Any], host_key: str, token: int, owner: str, expires: float, kind: str
) -> Lease:
    url_id, url, version, depth, attempts, due_at, row_kind = row[:7]
    etag, last_modified, prev_hash, prev_status, interval, hops = row[7:13]
    return Lease(
        url_id,
        url,
        host_key,
        version,
        token,
        owner,
        expires,
        depth,
        attempts,
        kind if kind == ROBOTS else row_kind,
        due_at,
        etag,
        last_modified,
        prev_hash,
        prev_status,
        interval,
        hops or 0,
    )


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
        """Bring the schema to SCHEMA_VERSION; safe when several processes open a new file."""
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version == SCHEMA_VERSION:
            return
        # Read the version again under the write lock: another process may have just migrated.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise FrontierError(
                    f"database {self.path!r} has schema version {version}, newer than this "
                    f"idemcrawl ({SCHEMA_VERSION}); upgrade idemcrawl"
                )
            if version == 0:
                tables = self._db.execute(
                    "SELECT count(*) FROM sqlite_master WHERE type='table'"
                ).fetchone()[0]
                if tables:
                    raise FrontierError(
                        f"{self.path!r} is an SQLite file but not an idemcrawl crawl"
                    )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for stmt in _split_sql(MIGRATIONS[target - 1]):
                    self._db.execute(stmt)
                self._db.execute(f"PRAGMA user_version={target}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
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
        rows = [_url_values(u, now) for u in urls]
        if not rows:
            return 0
        with self._tx() as db:
            return self._insert_urls(db, rows)

    @staticmethod
    def _insert_urls(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
        # rowcount of executemany sums sqlite3_changes(), which excludes trigger writes.
        return db.executemany(
            "INSERT OR IGNORE INTO urls(url, host_key, state, reason, priority, depth, due_at, "
            "discovered_at, kind, hops) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        ).rowcount

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
        with self._tx() as db:
            if fence is not None:
                self._check_fence(db, fence, owner, now)
            self._expire(db, now)
            if db.execute("SELECT 1 FROM meta WHERE key = 'paused' AND value = '1'").fetchone():
                return []  # the operator paused the whole crawl (idemcrawl control pause)
            hosts = db.execute(
                f"SELECT {_HOST_COLS} FROM hosts WHERE queued > 0 AND next_allowed_at <= ? "
                "AND backoff_until <= ? AND paused = 0 "
                "AND in_flight < MAX(1, COALESCE(max_in_flight, ?) >> MIN(error_streak, ?)) "
                # Only hosts with something due: a host holding only not-yet-due retries would
                # otherwise sit at the head of the window and starve ready hosts behind it.
                # INDEXED BY: planned on urls_state it walks every queued URL per candidate
                # host (6.2 ms at 12k queued, half the SQL thread); on urls_queue 0.04 ms.
                "AND EXISTS (SELECT 1 FROM urls u INDEXED BY urls_queue "
                "WHERE u.host_key = hosts.host_key "
                "AND u.state = 'queued' AND u.due_at <= ?) "
                "ORDER BY next_allowed_at LIMIT ?",
                (now, now, policy.max_in_flight, MAX_STREAK_SHIFT, now, limit * 2 + 8),
            ).fetchall()
            leases: list[Lease] = []
            expires = now + lease_seconds
            for row in hosts:
                room = limit - len(leases)
                if room <= 0:
                    break
                h = _HostRow(*row)
                leases.extend(self._lease_host(db, h, owner, room, now, expires, policy))
            self._bump(db, "leases_granted", len(leases))
            return leases

    def _lease_host(
        self,
        db: sqlite3.Connection,
        h: _HostRow,
        owner: str,
        room: int,
        now: float,
        expires: float,
        policy: HostPolicy,
    ) -> list[Lease]:
        """Level 2 for one ready host: its robots.txt first, then its best allowed URLs."""
        configured = h.delay if h.delay is not None else policy.delay
        max_in_flight = h.max_in_flight if h.max_in_flight is not None else policy.max_in_flight
        state: RobotsState | None = None
        cap = math.inf
        if policy.robots is not None:
            cap = policy.robots.settings.crawl_delay_cap
            state = state_from_row(h._asdict())
            if needs_fetch(state, now):
                return self._lease_robots(db, h, owner, now, expires, configured, policy)
            assert state is not None
            reason = _defer_reason(state, h.robots_failures, policy)
            if reason is not None:
                self._defer_host(db, h.host_key, reason)
                return []
            if state.mode == robots.DISALLOW_ALL:
                return []  # unreachable robots.txt: wait for its retry (host backs off until)
        delay = effective_delay(
            configured, state.crawl_delay if state else h.crawl_delay, cap, h.latency_ewma, policy
        )
        allow = allowance(max_in_flight, h.error_streak)
        left = budget_left(h, now, policy)
        if left <= 0:
            self._defer_host(db, h.host_key, "daily fetch budget exhausted")
            self._bump(db, "budget_exhausted", 1)
            return []
        # With a delay, one start per grant: a second grant now would break the spacing.
        take = int(min(room, allow - h.in_flight, 1 if delay > 0 else room, left))
        if take <= 0:
            return []
        picked: list[tuple[Any, ...]] = []
        picked_ids: set[int] = set()
        while len(picked) < take:
            # Rows picked in an earlier round are still 'queued' until granted: skip them.
            limit = take + (16 if state is not None else 0)
            rows = db.execute(
                f"SELECT {PICK_COLS} FROM urls "
                "WHERE host_key = ? AND state = 'queued' AND due_at <= ? "
                "AND kind <> 'robots' "
                "ORDER BY priority DESC, due_at LIMIT ?",
                (h.host_key, now, limit),
            ).fetchall()
            refused = []
            for r in rows:
                if r[0] in picked_ids or len(picked) >= take:
                    continue
                if (
                    state is None
                    or policy.robots is None
                    or policy.robots.allowed(h.host_key, state, r[1])
                ):
                    picked.append(r)
                    picked_ids.add(r[0])
                else:
                    refused.append((f"robots.txt disallows {policy.robots.token}", r[0]))
            if refused:
                db.executemany(
                    "UPDATE urls SET state = 'disallowed', reason = ? WHERE url_id = ?", refused
                )
                self._bump(db, "robots_disallowed", len(refused))
            if not refused or len(rows) < limit:
                break  # nothing more was refused, or the host's queue is exhausted
        return self._grant(db, h, picked, PAGE, owner, now, expires, delay, allow)

    def _lease_robots(
        self,
        db: sqlite3.Connection,
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
        url = robots.robots_url(h.host_key)
        row = db.execute("SELECT url_id, state FROM urls WHERE url = ?", (url,)).fetchone()
        if row is None:
            db.execute(
                "INSERT INTO urls(url, host_key, kind, state, due_at, discovered_at) "
                "VALUES (?, ?, 'robots', 'queued', ?, ?)",
                (url, h.host_key, now, now),
            )
        elif row[1] == LEASED:
            return []  # already being fetched
        elif row[1] != QUEUED:
            db.execute(
                "UPDATE urls SET state = 'queued', kind = 'robots', version = version + 1, "
                "due_at = ?, reason = NULL WHERE url_id = ?",
                (now, row[0]),
            )
        else:
            db.execute("UPDATE urls SET kind = 'robots' WHERE url_id = ?", (row[0],))
        r = db.execute(f"SELECT {PICK_COLS} FROM urls WHERE url = ?", (url,)).fetchone()
        return self._grant(db, h, [r], ROBOTS, owner, now, expires, delay, allow)

    def _grant(
        self,
        db: sqlite3.Connection,
        h: _HostRow,
        rows: Sequence[tuple[Any, ...]],
        kind: str,
        owner: str,
        now: float,
        expires: float,
        delay: float,
        allow: int,
    ) -> list[Lease]:
        if not rows:
            return []
        leases = []
        grants = []
        audit = []
        for i, row in enumerate(rows):
            token = self._rng.getrandbits(62) or 1
            ls = lease_from_row(row, h.host_key, token, owner, expires, kind)
            grants.append((owner, token, expires, now, ls.url_id))
            audit.append(
                (h.host_key, ls.url_id, ls.kind, now, ls.due_at, delay, allow, h.in_flight + i)
            )
            leases.append(ls)
        db.executemany(
            "UPDATE urls SET state = 'leased', lease_owner = ?, lease_token = ?, "
            "lease_expires_at = ?, leased_at = ? WHERE url_id = ?",
            grants,
        )
        db.executemany(
            "INSERT INTO lease_log(host_key, url_id, kind, granted_at, eligible_at, min_gap, "
            "allowance, in_flight_before) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            audit,
        )
        day = budget_day(now)
        db.execute(
            "UPDATE hosts SET next_allowed_at = ?, "
            "budget_used = CASE WHEN budget_day IS ? THEN budget_used + ? ELSE ? END, "
            "budget_day = ? WHERE host_key = ?",
            (now + delay, day, len(leases), len(leases), day, h.host_key),
        )
        return leases

    @staticmethod
    def _check_fence(db: sqlite3.Connection, fence: Fence, owner: str, now: float) -> None:
        row = db.execute(
            "SELECT owner, epoch, expires_at FROM partitions WHERE partition = ?",
            (fence.partition,),
        ).fetchone()
        if row is None or row[1] != fence.epoch or row[0] != owner or row[2] <= now:
            current = "none" if row is None else f"epoch {row[1]} owned by {row[0]}"
            raise StaleEpoch(
                f"partition {fence.partition}: fence epoch {fence.epoch} of {owner} is stale "
                f"(current: {current})"
            )

    def acquire_partition(self, partition: int, owner: str, now: float, ttl: float) -> Fence:
        with self._tx() as db:
            row = db.execute(
                "SELECT owner, epoch, expires_at FROM partitions WHERE partition = ?",
                (partition,),
            ).fetchone()
            if row is None:
                epoch = 1
                db.execute(
                    "INSERT INTO partitions(partition, owner, epoch, expires_at) "
                    "VALUES (?, ?, ?, ?)",
                    (partition, owner, epoch, now + ttl),
                )
                return Fence(partition, epoch)
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
            db.execute(
                "UPDATE partitions SET owner = ?, epoch = ?, expires_at = ? WHERE partition = ?",
                (owner, epoch, now + ttl, partition),
            )
            return Fence(partition, epoch)

    def renew_partition(self, fence: Fence, owner: str, now: float, ttl: float) -> None:
        with self._tx() as db:
            n = db.execute(
                "UPDATE partitions SET expires_at = ? WHERE partition = ? AND owner = ? "
                "AND epoch = ?",
                (now + ttl, fence.partition, owner, fence.epoch),
            ).rowcount
            if n != 1:
                raise StaleEpoch(
                    f"partition {fence.partition}: cannot renew epoch {fence.epoch} for {owner}"
                )

    def _defer_host(self, db: sqlite3.Connection, host_key: str, reason: str) -> None:
        n = db.execute(
            # INDEXED BY: the planner otherwise picks the low-selectivity state index and scans
            # every queued URL of the crawl (365 ms at 1.1M queued, vs 0.13 ms).
            "UPDATE urls INDEXED BY urls_queue SET state = 'deferred', reason = ? "
            "WHERE host_key = ? AND state = 'queued' AND kind <> 'robots'",
            (reason, host_key),
        ).rowcount
        self._bump(db, "urls_deferred", n)

    def requeue_deferred(self) -> int:
        with self._tx() as db:
            db.execute("UPDATE hosts SET robots_failures = 0 WHERE robots_failures > 0")
            return db.execute(
                "UPDATE urls SET state = 'queued', reason = NULL WHERE state = 'deferred'"
            ).rowcount

    def complete(
        self, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        """One transaction for the batch; each completion fenced on (url_id, version, token).

        The fencing UPDATE runs per completion (its rowcount says whether it is accepted); the
        rest — host updates, records, links, events — is one executemany each for the whole
        batch, so a group commit costs a handful of statements, not a handful per page.
        """
        accepted: list[bool] = []
        if not completions:
            return accepted
        with self._tx() as db:
            pages: list[Completion] = []
            for c in completions:
                ls = c.lease
                cur = db.execute(
                    f"UPDATE urls SET {_DONE_SET} "
                    "WHERE url_id = ? AND state = 'leased' AND version = ? AND lease_token = ?",
                    (*done_values(c), ls.url_id, ls.version, ls.token),
                )
                ok = cur.rowcount == 1
                accepted.append(ok)
                if not ok:
                    continue
                if ls.kind == ROBOTS:
                    # Store first: a Crawl-delay learnt here already spaces the next request.
                    self._store_robots(db, ls.host_key, c, now, policy)
                    self._hosts_success(db, [c], now, policy)
                else:
                    pages.append(c)
            self._hosts_success(db, pages, now, policy)
            records = [
                (r.record_id, r.source, r.key, c.lease.url, r.data_json, r.content_hash, now, now)
                for c in pages
                for r in c.records
            ]
            if records:
                db.executemany(_UPSERT_RECORD, records)
            links = [_url_values(u, now) for c in pages for u in c.links]
            links_new = self._insert_urls(db, links) if links else 0
            # Sitemaps emit no event; a round that changed nothing (304, same body) neither.
            indexed = [c for c in pages if c.lease.kind in (PAGE, DOWNLOAD) and c.changed]
            if indexed:
                db.executemany(
                    "INSERT INTO events(url_id, url_version, url, status, fetched_at, "
                    "content_hash, records, links, warc_file, warc_offset, warc_length, "
                    "payload_digest, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(url_id, url_version) DO NOTHING",
                    [event_values(c, now) for c in indexed],
                )
            bodies = [
                (c.payload_digest, c.lease.url_id, c.lease.url, c.warc_file, c.warc_offset,
                 c.warc_length, now)
                for c in pages
                if c.stored_body and c.payload_digest and c.warc_file is not None
            ]
            if bodies:
                db.executemany(
                    "INSERT OR IGNORE INTO bodies(payload_digest, url_id, url, warc_file, "
                    "warc_offset, warc_length, first_seen) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    bodies,
                )
            for c in pages:
                if c.redirect_to is not None and self._redirect_loop(db, c):
                    db.execute(
                        "UPDATE urls SET last_error = ? WHERE url_id = ?",
                        (f"redirect loop via {c.redirect_to}", c.lease.url_id),
                    )
                    self._bump(db, "redirect_loops", 1)
            n_ok = sum(accepted)
            self._bump(db, "fetches", n_ok)
            self._bump(db, "completions_rejected", len(accepted) - n_ok)
            self._bump(db, "links_new", links_new)
            self._bump(db, "url_duplicates", len(links) - links_new)
            for name, n in completion_counters(pages).items():
                self._bump(db, name, n)
            rejected: dict[str, int] = {}
            for c in pages:
                for reason, n in c.rejections.items():
                    rejected[reason] = rejected.get(reason, 0) + n
            for reason, n in rejected.items():
                self._bump(db, f"links_rejected_{reason}", n)
        return accepted

    @staticmethod
    def _redirect_loop(db: sqlite3.Connection, c: Completion) -> bool:
        def target_of(url: str) -> str | None:
            row = db.execute("SELECT redirect_to FROM urls WHERE url = ?", (url,)).fetchone()
            return row[0] if row else None

        return redirect_loop(c.lease.url, c.redirect_to, target_of)

    def _store_robots(
        self, db: sqlite3.Connection, host_key: str, c: Completion, now: float, policy: HostPolicy
    ) -> None:
        """Turn a robots.txt fetch into host state, keeping the last good copy (R7)."""
        if policy.robots is None or c.robots is None:
            return
        cur = db.execute(f"SELECT {_HOST_COLS} FROM hosts WHERE host_key = ?", (host_key,))
        h = _HostRow(*cur.fetchone())
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
        db.execute(
            "UPDATE hosts SET robots_state = ?, robots_body = ?, robots_fetched_at = ?, "
            "robots_expires_at = ?, crawl_delay = ?, robots_meta = ?, robots_failures = ? "
            "WHERE host_key = ?",
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
        self._bump(db, "robots_fetches", 1)
        own = [u for u in sitemap_urls(state.sitemaps, host_key)]
        if own:
            self._insert_urls(
                db,
                [_url_values(u, now) for u in own],
            )
        reason = _defer_reason(state, failures, policy)
        if reason is not None:
            self._defer_host(db, host_key, reason)
        elif state.mode == robots.DISALLOW_ALL:
            db.execute(
                "UPDATE hosts SET backoff_until = MAX(backoff_until, ?), backoff_reason = ? "
                "WHERE host_key = ?",
                (state.expires_at, f"robots.txt unreachable: {state.last_error}", host_key),
            )

    def fail(self, failures: Sequence[Failure], now: float, policy: HostPolicy) -> list[bool]:
        accepted: list[bool] = []
        if not failures:
            return accepted
        with self._tx() as db:
            for f in failures:
                ls = f.lease
                retry_at = f.retry_at
                current = db.execute(
                    "SELECT 1 FROM urls WHERE url_id = ? AND state = 'leased' AND version = ? "
                    "AND lease_token = ?",
                    (ls.url_id, ls.version, ls.token),
                ).fetchone()
                if current is None:  # stale or duplicate: changes nothing (I3)
                    accepted.append(False)
                    continue
                if f.host_error:
                    rest = self._host_error(db, ls.host_key, f.retry_after, now, policy)
                    if retry_at is not None:
                        retry_at = max(retry_at, now + rest)
                final = retry_at is None
                cur = db.execute(
                    "UPDATE urls SET state = ?, due_at = ?, attempts = attempts + 1, "
                    "last_error = ?, reason = ?, status_code = COALESCE(?, status_code), "
                    "warc_file = COALESCE(?, warc_file), warc_offset = COALESCE(?, warc_offset), "
                    "warc_length = COALESCE(?, warc_length), "
                    "payload_digest = COALESCE(?, payload_digest), "
                    "lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL "
                    "WHERE url_id = ? AND state = 'leased' AND version = ? AND lease_token = ?",
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
            for f, ok in zip(failures, accepted, strict=True):
                cls = status_class(f.status) if ok else None
                if cls:
                    self._bump(db, f"status_{cls}", 1)
                if ok and f.retry_at is not None:
                    self._bump(db, "retries", 1)
            self._bump(db, "completions_rejected", len(accepted) - n_ok)
        return accepted

    def _host_error(
        self,
        db: sqlite3.Connection,
        host_key: str,
        retry_after: float | None,
        now: float,
        policy: HostPolicy,
    ) -> float:
        """Count an error against the host and back it off (R8); returns the rest in seconds."""
        (streak,) = db.execute(
            "SELECT error_streak FROM hosts WHERE host_key = ?", (host_key,)
        ).fetchone()
        streak += 1
        rest, reason = backoff_seconds(streak, retry_after, policy, self._rng)
        db.execute(
            "UPDATE hosts SET error_streak = ?, backoff_until = MAX(backoff_until, ?), "
            "backoff_reason = ? WHERE host_key = ?",
            (streak, now + rest, reason, host_key),
        )
        if streak == policy.breaker_threshold:
            self._bump(db, "breaker_trips", 1)
        self._bump(db, "host_backoffs", 1)
        return rest

    def _hosts_success(
        self, db: sqlite3.Connection, done: Sequence[Completion], now: float, policy: HostPolicy
    ) -> None:
        """A good answer: the error streak steps down, latency feeds the adaptive delay (R8)."""
        if not done:
            return
        cap = policy.robots.settings.crawl_delay_cap if policy.robots is not None else -1.0
        # The latency update is politeness.update_latency written in SQL (same LATENCY_ALPHA).
        db.executemany(
            "UPDATE hosts SET "
            "latency_ewma = CASE WHEN ?1 IS NULL THEN latency_ewma "
            "  WHEN latency_ewma IS NULL THEN ?1 ELSE latency_ewma + ?2 * (?1 - latency_ewma) END, "
            "error_streak = MAX(0, error_streak - 1), "
            "backoff_reason = CASE WHEN error_streak <= 1 THEN NULL ELSE backoff_reason END, "
            "next_allowed_at = MAX(next_allowed_at, ?3 + MAX(COALESCE(delay, ?4), "
            "  CASE WHEN crawl_delay <= ?5 THEN crawl_delay ELSE 0 END)) "
            "WHERE host_key = ?6",
            [(c.latency, LATENCY_ALPHA, now, policy.delay, cap, c.lease.host_key) for c in done],
        )

    @staticmethod
    def _after_request(db: sqlite3.Connection, host_key: str, now: float, p: HostPolicy) -> None:
        # I8: the delay (configured, or robots Crawl-delay within the cap) also separates the end
        # of one response from the next start.
        cap = p.robots.settings.crawl_delay_cap if p.robots is not None else -1.0
        db.execute(
            "UPDATE hosts SET next_allowed_at = MAX(next_allowed_at, ? + MAX(COALESCE(delay, ?), "
            "CASE WHEN crawl_delay <= ? THEN crawl_delay ELSE 0 END)) WHERE host_key = ?",
            (now, p.delay, cap, host_key),
        )

    def expire(self, now: float) -> int:
        with self._tx() as db:
            return self._expire(db, now)

    def _expire(self, db: sqlite3.Connection, now: float) -> int:
        n = db.execute(
            "UPDATE urls INDEXED BY urls_leases SET state = 'queued', due_at = ?, "
            "lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL "
            "WHERE state = 'leased' AND lease_expires_at <= ?",
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

    def existing_urls(self, candidates: Sequence[str]) -> set[str]:
        """Which of ``candidates`` are known: the durable-key look-up a Bloom filter saves."""
        found: set[str] = set()
        with self._lock:
            for i in range(0, len(candidates), 900):
                chunk = candidates[i : i + 900]
                marks = ",".join("?" * len(chunk))
                found.update(
                    r[0]
                    for r in self._db.execute(f"SELECT url FROM urls WHERE url IN ({marks})", chunk)
                )
        return found

    def known_urls(self) -> Iterable[str]:
        with self._lock:
            rows = self._db.execute("SELECT url FROM urls").fetchall()
        return [r[0] for r in rows]

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
                self._db.execute(
                    "SELECT MIN(due_at) FROM urls INDEXED BY urls_due WHERE state = 'queued'"
                ).fetchone()[0]
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
            next_refetch = self._db.execute(
                "SELECT MIN(next_fetch_at) FROM urls INDEXED BY urls_refetch WHERE state = 'done'"
            ).fetchone()[0]
        return Progress(queued, leased, next_due, next_exp, host_ready, next_refetch)

    # -- recrawl, content dedup, live control ----------------------------------------------------

    def reschedule_due(self, now: float, limit: int) -> int:
        with self._tx() as db:
            n = db.execute(
                "UPDATE urls SET state = 'queued', version = version + 1, due_at = next_fetch_at, "
                "attempts = 0, reason = NULL WHERE url_id IN (SELECT url_id FROM urls "
                "INDEXED BY urls_refetch WHERE state = 'done' AND next_fetch_at <= ? "
                "AND kind <> 'robots' ORDER BY next_fetch_at LIMIT ?)",
                (now, limit),
            ).rowcount
            self._bump(db, "revisits", n)
            return n

    def find_bodies(self, digests: Sequence[str]) -> dict[str, tuple[str, int, int, str]]:
        out: dict[str, tuple[str, int, int, str]] = {}
        with self._lock:
            for i in range(0, len(digests), 900):
                chunk = list(digests[i : i + 900])
                marks = ",".join("?" * len(chunk))
                for d, f, o, n, u in self._db.execute(
                    "SELECT payload_digest, warc_file, warc_offset, warc_length, url FROM bodies "
                    f"WHERE payload_digest IN ({marks})",
                    chunk,
                ):
                    out[d] = (f, o, n, u)
        return out

    def body_digests(self) -> Iterable[str]:
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT payload_digest FROM bodies")]

    def simhashes(self) -> Iterable[tuple[int, int, int | None]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT url_id, simhash, near_dup_of FROM urls WHERE simhash IS NOT NULL"
            ).fetchall()
        return [(u, h & 0xFFFFFFFFFFFFFFFF, n) for u, h, n in rows]

    def reparse_candidates(
        self, where_failed: bool, after_id: int, limit: int
    ) -> list[dict[str, Any]]:
        where = "url_id > ? AND warc_file IS NOT NULL AND kind = 'page' AND " + (
            "state = 'failed' AND last_error LIKE 'parse%'"
            if where_failed
            else "state IN ('done', 'failed')"
        )
        with self._lock:
            cur = self._db.execute(
                f"SELECT {REPARSE_COLS} FROM urls WHERE {where} ORDER BY url_id LIMIT ?",
                (after_id, limit),
            )
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def apply_reparse(self, items: Sequence[Reparsed], now: float) -> int:
        if not items:
            return 0
        with self._tx() as db:
            records = [
                (r.record_id, r.source, r.key, it.url, r.data_json, r.content_hash, now, now)
                for it in items
                if it.error is None
                for r in it.records
            ]
            db.executemany(_UPSERT_RECORD, records)
            links = [_url_values(u, now) for it in items if it.error is None for u in it.links]
            new = self._insert_urls(db, links) if links else 0
            db.executemany(
                "UPDATE urls SET state = CASE WHEN ?1 IS NULL AND state = 'failed' THEN 'done' "
                "ELSE state END, last_error = ?1, reason = CASE WHEN ?1 IS NULL THEN NULL "
                "ELSE reason END WHERE url_id = ?2",
                [(it.error, it.url_id) for it in items],
            )
            self._bump(db, "reparsed", len(items))
            self._bump(db, "links_new", new)
            return len(records)

    def eligibility_delay_histogram(self, bounds: Sequence[float]) -> dict[str, Any]:
        bounds = [float(b) for b in bounds if not math.isinf(b)]  # +inf is the total count
        delay = "MAX(0, granted_at - eligible_at)"
        cases = "".join(f"SUM({delay} <= ?), " for _ in bounds)
        with self._lock:
            row = self._db.execute(
                f"SELECT {cases}count(*), COALESCE(SUM({delay}), 0) FROM lease_log",
                [float(b) for b in bounds],
            ).fetchone()
        return {"counts": [int(x or 0) for x in row[:-1]], "sum": float(row[-1])}

    def recent_errors(self, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._db.execute(
                "SELECT url, host_key, state, status_code, last_error, fetched_at FROM urls "
                "WHERE last_error IS NOT NULL ORDER BY COALESCE(fetched_at, due_at) DESC "
                "LIMIT ?",
                (limit,),
            )
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def control(self, action: str, host_key: str | None = None, value: Any = None) -> int:
        with self._tx() as db:
            return _control(db, action, host_key, value, self._bump)

    def set_host_overrides(
        self, host_key: str, *, delay: float | None, max_in_flight: int | None
    ) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO hosts(host_key) VALUES (?)", (host_key,))
            db.execute(
                "UPDATE hosts SET delay = ?, max_in_flight = ? WHERE host_key = ?",
                (delay, max_in_flight, host_key),
            )

    def hosts_report(self, now: float) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._db.execute(
                "SELECT host_key, queued, in_flight, max_in_flight, delay, next_allowed_at, "
                "backoff_until, backoff_reason, error_streak, latency_ewma, paused, robots_state, "
                "robots_fetched_at, robots_expires_at, crawl_delay, robots_meta, robots_failures "
                "FROM hosts ORDER BY host_key"
            )
            cols = [d[0] for d in cur.description]
            rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        out = []
        for r in rows:
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
        with self._lock:
            gap_or_slot = self._db.execute(
                "SELECT host_key, count(*) FROM (SELECT host_key, granted_at, allowance, "
                "in_flight_before, LAG(granted_at) OVER w AS prev_at, "
                "LAG(min_gap) OVER w AS prev_gap FROM lease_log "
                "WINDOW w AS (PARTITION BY host_key ORDER BY granted_at, id)) "
                "WHERE in_flight_before >= allowance OR granted_at < prev_at + prev_gap - 1e-6 "
                "GROUP BY host_key"
            ).fetchall()
            delays = [
                r[0]
                for r in self._db.execute(
                    "SELECT MAX(0, granted_at - eligible_at) FROM lease_log "
                    "ORDER BY id DESC LIMIT 100000"
                )
            ]
            grants = self._db.execute("SELECT count(*) FROM lease_log").fetchone()[0]
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

    # -- outputs: events and exports --
    # Read side of R21/R22. Streams page through the primary key (keyset, one short read under
    # the lock per batch): the engine thread shares this connection, so an export must neither
    # hold it for its whole run nor keep every row in memory. A row that changes while an export
    # runs appears once, as its batch saw it.

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
        with self._lock:
            cur = self._db.execute(query, params)
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def _keyset(
        self, table: str, cols: str, key: str, start: Any, batch: int
    ) -> Iterator[dict[str, Any]]:
        if batch <= 0:
            raise ValueError(f"batch must be positive, got {batch}")
        last = start
        while True:
            rows = self._dicts(
                f"SELECT {cols} FROM {table} WHERE {key} > ? ORDER BY {key} LIMIT ?", (last, batch)
            )
            yield from rows
            if len(rows) < batch:
                return
            last = rows[-1][key]

    def events_after(self, cursor: int, limit: int) -> list[dict[str, Any]]:
        if limit <= 0:
            return []
        return self._dicts(
            f"SELECT {self._EVENT_COLS} FROM events WHERE event_id > ? ORDER BY event_id LIMIT ?",
            (cursor, limit),
        )

    def get_cursor(self, consumer: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT cursor FROM deliveries WHERE consumer = ?", (consumer,)
            ).fetchone()
        return int(row[0]) if row else 0

    def set_cursor(self, consumer: str, cursor: int) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO deliveries(consumer, cursor) VALUES (?, ?) ON CONFLICT(consumer) "
                "DO UPDATE SET cursor = MAX(deliveries.cursor, excluded.cursor)",
                (consumer, cursor),
            )

    def iter_urls(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("urls", self._URL_COLS, "url_id", 0, batch)

    def iter_events(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("events", self._EVENT_COLS, "event_id", 0, batch)

    def iter_records(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return self._keyset("records", self._RECORD_COLS, "record_id", "", batch)

    def aggregates(self) -> dict[str, Any]:
        with self._lock:
            db = self._db
            db.execute("BEGIN")  # one read snapshot for all the GROUP BYs
            try:
                by_state = dict.fromkeys(STATES, 0)
                by_state.update(db.execute("SELECT state, count(*) FROM urls GROUP BY state"))
                by_status = dict(
                    db.execute(
                        "SELECT status_code, count(*) FROM urls WHERE status_code IS NOT NULL "
                        "GROUP BY status_code ORDER BY status_code"
                    )
                )
                fetched, body_bytes = db.execute(
                    "SELECT count(fetched_at), COALESCE(SUM(body_bytes), 0) FROM urls"
                ).fetchone()
                by_source = dict(
                    db.execute(
                        "SELECT source, count(*) FROM records GROUP BY source ORDER BY source"
                    )
                )
                (events,) = db.execute("SELECT count(*) FROM events").fetchone()
            finally:
                db.execute("COMMIT")
        return {
            "urls": sum(by_state.values()),
            "urls_by_state": by_state,
            "fetched": fetched,
            "status_codes": by_status,
            "body_bytes": body_bytes,
            "records": sum(by_source.values()),
            "records_by_source": by_source,
            "events": events,
        }


def _url_values(u: NewURL, now: float) -> tuple[Any, ...]:
    """Parameters of ``_insert_urls`` for one new URL."""
    return (u.url, u.host_key, u.state, u.reason, u.priority, u.depth, now, now, u.kind, u.hops)


def _control(
    db: sqlite3.Connection,
    action: str,
    host_key: str | None,
    value: Any,
    bump: Any,
) -> int:
    """The live-control actions; every running process sees them at its next lease."""
    value = control_value(action, host_key, value)
    if host_key is None:
        db.execute(
            "INSERT INTO meta(key, value) VALUES ('paused', ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            ("1" if action == "pause" else "0",),
        )
        return 1
    db.execute("INSERT OR IGNORE INTO hosts(host_key) VALUES (?)", (host_key,))
    if action == "pause":
        return db.execute(
            "UPDATE hosts SET paused = 1, pause_reason = 'paused by operator' WHERE host_key = ?",
            (host_key,),
        ).rowcount
    if action in ("resume", "unblock"):
        n = db.execute(
            "UPDATE hosts SET paused = 0, pause_reason = NULL WHERE host_key = ?", (host_key,)
        ).rowcount
        if action == "unblock":
            db.execute(
                "UPDATE urls SET state = 'queued', reason = NULL WHERE host_key = ? "
                "AND state = 'deferred' AND reason = 'blocked by operator'",
                (host_key,),
            )
        return n
    if action == "block":
        db.execute(
            "UPDATE hosts SET paused = 1, pause_reason = 'blocked by operator' "
            "WHERE host_key = ?",
            (host_key,),
        )
        n = db.execute(
            "UPDATE urls SET state = 'deferred', reason = 'blocked by operator' "
            "WHERE host_key = ? AND state = 'queued'",
            (host_key,),
        ).rowcount
        bump(db, "urls_deferred", n)
        return 1
    if action == "set-delay":
        return db.execute(
            "UPDATE hosts SET delay = ? WHERE host_key = ?", (value, host_key)
        ).rowcount
    if action == "set-budget":
        return db.execute(
            "UPDATE hosts SET budget = ? WHERE host_key = ?",
            (value, host_key),
        ).rowcount
    raise AssertionError(action)  # control_value admits only the actions above


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
