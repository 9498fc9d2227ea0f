"""The embedded SQLite frontier: one file, WAL, zero set-up.

Why these settings:

* ``journal_mode=WAL`` lets ``status``/``export`` read while a crawl writes, and makes a commit
  one sequential append.
* ``synchronous=NORMAL``: in WAL mode a committed transaction survives a process kill (SIGKILL)
  because it is in the OS page cache; only a power loss can drop the last commits. Our promise is
  about process death, and FULL would cost one fsync per group commit.
* Every write transaction is ``BEGIN IMMEDIATE`` so several ``idemcrawl crawl`` processes on one
  file serialise their grants instead of failing with SQLITE_BUSY half-way (busy_timeout waits).
  That is also why the scheduler's "locks" are plain reads here: the whole file is the lock.
* ``hosts.in_flight`` and ``hosts.queued`` (invariant I6) are counted by the statements that
  move URLs (insert, grant, complete, fail, expire, defer...), once per host per statement
  (schema 5 and 8; ``sql.SQLStore``), in the same transaction, so the host token state cannot
  drift from the URL states it summarises. No row trigger: its program ran per changed row.
* The WAL is checkpointed by a thread of the frontier's own (:class:`_Checkpointer`, its own
  connection, ``wal_checkpoint(PASSIVE)``), woken by write commits, not inside the commit that
  crosses SQLite's autocheckpoint size: a checkpoint copies the WAL into the database and, at
  ``synchronous=NORMAL``, fsyncs both files; done by the committing call, that wait was part of
  nearly every lease and completion at 10^6 URLs (issue 14: 10-31 ms of wall time per COMMIT on
  the shared disk, for about 2 ms of CPU). The connection keeps a far larger autocheckpoint as
  a backstop, should the thread fall behind.

The policy is ``scheduler.py``'s and the SQL is ``sql.py``'s (SQLite dialect); this module is the
connection, the transaction and the schema.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .base import FrontierError
from .scheduler import Scheduler
from .sql import SQLStore
from .sql_dialect import SQLITE
from .store import SCHEMA_VERSION

T = TypeVar("T")

log = logging.getLogger(__name__)

# None binds as NULL through the sqlite3 module's adapter registry. A parameter that is not an
# exact int, float, str or bytearray is "adapted" before it is bound, None included: with no
# adapter registered for its type, the module looks up ``__adapt__`` on the protocol (raising
# and clearing an AttributeError) and ``__conform__`` on None, ~2,500 instructions per None
# (30 of them per completed page in ``bench frontier``: links' reason, the completion's unset
# validators, the event's WARC fields; 13.8 % of a completion batch's instructions). With this
# entry the lookup is one dict probe and the call of a C method that returns None unchanged
# (``{}.get(None)``), so the value bound is the same NULL. Process-wide, like the registry; not
# added over an adapter someone else registered for None.
_NONE_ADAPTER_KEY = (type(None), sqlite3.PrepareProtocol)
if _NONE_ADAPTER_KEY not in sqlite3.adapters:
    sqlite3.register_adapter(type(None), {}.get)

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
    # 4: requests as data and the cookie jar (issue 16): how a URL is fetched and parsed when
    # that is not a plain
    # GET for the spider's parse(). Sparse: only URLs that have one get a row, in the same
    # transaction as the URL (frontier/base.py I11); the key of a non-GET URL carries its
    # method and body digest (base.request_key).
    """
CREATE TABLE requests (
    url_id   INTEGER PRIMARY KEY,   -- urls.url_id
    method   TEXT    NOT NULL,      -- GET, POST, ...
    callback TEXT,                  -- the spider method's name; NULL: parse
    data     TEXT,                  -- the context a callback gets as page.data (JSON)
    headers  TEXT,                  -- extra request headers, JSON [[name, value], ...]
    body     BLOB,                  -- request body
    render   INTEGER NOT NULL DEFAULT 0  -- 1: rendered in headless Chromium before parsing
);
-- The crawl's cookie jar (spiders with keep_cookies; idemcrawl/cookies.py), shared by every
-- process and written with the completion of the response that set each cookie (I12).
CREATE TABLE cookies (
    domain    TEXT    NOT NULL,
    path      TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    value     TEXT    NOT NULL,
    expires   REAL,                 -- NULL: a session cookie (kept for the crawl)
    secure    INTEGER NOT NULL,
    host_only INTEGER NOT NULL,
    PRIMARY KEY (domain, path, name)
);
""",
    # 5: hosts.queued / in_flight of inserted URLs are counted by the insert itself, once per
    # host per batch (sql.SQLStore.insert_urls), not by a row trigger doing two host-row
    # writes per URL: the trigger was 46 % of a completion batch's time (issue 14).
    "DROP TRIGGER urls_insert;",
    # 6: fewer bytes per URL (issue 14). A URL row names its host by an integer id instead of
    # repeating the host key's text, and so does its queue index; the index on urls.state goes
    # (34 bytes per URL): its readers use the partial indexes of leased and deferred URLs, and
    # the per-state totals are kept in url_states (by the insert and the state trigger), so
    # stats() reads eight rows instead of counting every URL. The index of queued URLs by due
    # time goes too (16 bytes per URL): progress() takes the earliest due time from each host's
    # due_hint, which every URL entering its queue lowers (the state trigger, the insert).
    # SQLite cannot change a column or a primary key in place: hosts and urls are rebuilt, in
    # one transaction.
    """
CREATE TABLE hosts6 (
    host_id         INTEGER PRIMARY KEY,
    host_key        TEXT    NOT NULL UNIQUE,
    next_allowed_at REAL    NOT NULL DEFAULT 0,
    in_flight       INTEGER NOT NULL DEFAULT 0,
    queued          INTEGER NOT NULL DEFAULT 0,
    max_in_flight   INTEGER,
    delay           REAL,
    backoff_until   REAL    NOT NULL DEFAULT 0,
    error_streak    INTEGER NOT NULL DEFAULT 0,
    latency_ewma    REAL,
    paused          INTEGER NOT NULL DEFAULT 0,
    pause_reason    TEXT,
    robots_state    TEXT,
    robots_body     BLOB,
    robots_fetched_at REAL,
    robots_expires_at REAL,
    crawl_delay     REAL,
    budget_day      TEXT,
    budget_used     INTEGER NOT NULL DEFAULT 0,
    robots_meta     TEXT,
    robots_failures INTEGER NOT NULL DEFAULT 0,
    backoff_reason  TEXT,
    budget          INTEGER,
    due_hint        REAL                          -- <= due_at of each of its queued URLs
);
INSERT INTO hosts6 (host_key, next_allowed_at, in_flight, queued, max_in_flight, delay,
    backoff_until, error_streak, latency_ewma, paused, pause_reason, robots_state, robots_body,
    robots_fetched_at, robots_expires_at, crawl_delay, budget_day, budget_used, robots_meta,
    robots_failures, backoff_reason, budget)
SELECT host_key, next_allowed_at, in_flight, queued, max_in_flight, delay, backoff_until,
    error_streak, latency_ewma, paused, pause_reason, robots_state, robots_body,
    robots_fetched_at, robots_expires_at, crawl_delay, budget_day, budget_used, robots_meta,
    robots_failures, backoff_reason, budget
FROM hosts ORDER BY host_key;
INSERT OR IGNORE INTO hosts6 (host_key) SELECT DISTINCT host_key FROM urls ORDER BY host_key;
CREATE TABLE urls6 (
    url_id           INTEGER PRIMARY KEY,
    url              TEXT    NOT NULL UNIQUE,
    host_id          INTEGER NOT NULL,            -- hosts.host_id
    state            TEXT    NOT NULL DEFAULT 'queued',
    reason           TEXT,
    version          INTEGER NOT NULL DEFAULT 1,
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
    payload_digest   TEXT,
    kind             TEXT    NOT NULL DEFAULT 'page',
    hops             INTEGER NOT NULL DEFAULT 0,
    redirect_to      TEXT,
    near_dup_of      INTEGER,
    stored_file      TEXT
);
INSERT INTO urls6 SELECT u.url_id, u.url, h.host_id, u.state, u.reason, u.version, u.priority,
    u.depth, u.due_at, u.discovered_at, u.lease_owner, u.lease_token, u.lease_expires_at,
    u.leased_at, u.attempts, u.last_error, u.status_code, u.fetched_at, u.body_bytes,
    u.content_hash, u.simhash, u.etag, u.last_modified, u.next_fetch_at, u.revisit_interval,
    u.canonical_hint, u.warc_file, u.warc_offset, u.warc_length, u.payload_digest, u.kind,
    u.hops, u.redirect_to, u.near_dup_of, u.stored_file
FROM urls AS u JOIN hosts6 AS h ON h.host_key = u.host_key ORDER BY u.url_id;
DROP TABLE urls;
DROP TABLE hosts;
ALTER TABLE hosts6 RENAME TO hosts;
ALTER TABLE urls6 RENAME TO urls;
CREATE INDEX hosts_ready ON hosts(next_allowed_at) WHERE queued > 0;
CREATE INDEX urls_queue ON urls(host_id, priority DESC, due_at) WHERE state = 'queued';
CREATE INDEX urls_leases ON urls(lease_expires_at) WHERE state = 'leased';
CREATE INDEX urls_refetch ON urls(next_fetch_at) WHERE state = 'done';
CREATE INDEX urls_deferred ON urls(host_id) WHERE state = 'deferred';
-- URLs per state: = count(*) of urls by state (the insert counts its rows, the trigger the
-- changes), one row per state of base.STATES.
CREATE TABLE url_states (state TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0);
INSERT INTO url_states(state) VALUES ('queued'), ('leased'), ('done'), ('failed'),
    ('out_of_scope'), ('disallowed'), ('deferred'), ('rejected');
INSERT INTO url_states(state, n) SELECT state, count(*) FROM urls GROUP BY state
    ON CONFLICT(state) DO UPDATE SET n = excluded.n;
UPDATE hosts SET due_hint = (SELECT MIN(due_at) FROM urls INDEXED BY urls_queue
    WHERE urls.host_id = hosts.host_id AND state = 'queued');
-- The lease log names the host by its id too (one row per grant).
INSERT OR IGNORE INTO hosts (host_key) SELECT DISTINCT host_key FROM lease_log ORDER BY host_key;
CREATE TABLE lease_log6 (
    id               INTEGER PRIMARY KEY,
    host_id          INTEGER NOT NULL,            -- hosts.host_id
    url_id           INTEGER NOT NULL,
    kind             TEXT    NOT NULL,
    granted_at       REAL    NOT NULL,
    eligible_at      REAL    NOT NULL,
    min_gap          REAL    NOT NULL,
    allowance        INTEGER NOT NULL,
    in_flight_before INTEGER NOT NULL
);
INSERT INTO lease_log6 SELECT l.id, h.host_id, l.url_id, l.kind, l.granted_at, l.eligible_at,
    l.min_gap, l.allowance, l.in_flight_before
FROM lease_log AS l JOIN hosts AS h ON h.host_key = l.host_key ORDER BY l.id;
DROP TABLE lease_log;
ALTER TABLE lease_log6 RENAME TO lease_log;
CREATE INDEX lease_log_host ON lease_log(host_id, granted_at);
CREATE TRIGGER urls_state AFTER UPDATE OF state ON urls WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE hosts SET queued = queued + (NEW.state = 'queued') - (OLD.state = 'queued'),
                     in_flight = in_flight + (NEW.state = 'leased') - (OLD.state = 'leased'),
                     due_hint = CASE WHEN NEW.state <> 'queued' THEN due_hint
                                     WHEN queued = 0 THEN NEW.due_at
                                     ELSE MIN(COALESCE(due_hint, NEW.due_at), NEW.due_at) END
     WHERE host_id = NEW.host_id;
END;
-- A grant (queued -> leased) and a completion (leased -> done) count their URLs in one
-- statement per batch (sql.SQLStore.grant, finish): the two moves of every page, not per row.
CREATE TRIGGER urls_state_total AFTER UPDATE OF state ON urls WHEN OLD.state IS NOT NEW.state
    AND NOT (OLD.state = 'queued' AND NEW.state = 'leased')
    AND NOT (OLD.state = 'leased' AND NEW.state = 'done') BEGIN
    UPDATE url_states SET n = n + (state = NEW.state) - (state = OLD.state)
     WHERE state IN (OLD.state, NEW.state);
END;
""",
    # 7: PostgreSQL's count triggers keep to index probes of hosts (postgres_schema.py). The
    # version numbers are shared; SQLite's row triggers and statements probe hosts by key
    # already, so nothing changes here but the version.
    """
-- nothing: the version alone
""",
    # 8: no row trigger on urls.state (issue 14): the statements that move URLs between states
    # count the moves into hosts.queued/in_flight/due_hint (I6) and url_states themselves, once
    # per host per statement, as the insert does since version 5 (sql.SQLStore: grant and
    # finish in the host writes they make anyway, every rarer move through RETURNING). The
    # trigger's program ran for every changed row even when its WHEN left the row alone: 3.2
    # of the 11.1 M instructions of a lease call's grant update of 256 rows.
    """
DROP TRIGGER urls_state;
DROP TRIGGER urls_state_total;
""",
    # 9: PostgreSQL's URL key becomes a b-tree on a 64-bit hash of the URL (postgres_schema.py);
    # SQLite's is a unique b-tree on the text already: the version alone.
    """
-- nothing: the version alone
""",
    # 10: PostgreSQL's ANALYZE skips the columns no plan uses (postgres_schema.py); SQLite's
    # ANALYZE keeps statistics of indexes only: the version alone.
    """
-- nothing: the version alone
""",
    # 11: PostgreSQL's refetch index leaves out URLs without a refetch time, and its
    # completions count their own URLs (postgres_schema.py, postgres_store.py): the version
    # alone here.
    """
-- nothing: the version alone
""",
    # 12: no index of the lease log by host (issue 14; postgres_schema.py): the audit sorts the
    # whole log, and nothing reads one host's grants by the index. The id stays the rowid.
    """
DROP INDEX lease_log_host;
""",
    # 13: why URLs failed for good, with the last frames of a spider exception's traceback:
    # the end of ``crawl`` and ``status`` show the failures grouped by reason. A side table,
    # written by the failure path only (``SQLStore.record_failures``), so a URL row and a
    # completion cost nothing more; a URL that leaves 'failed' (a reparse that succeeds)
    # leaves its row behind, which the reads skip (they join urls for state = 'failed'). A
    # crawl that failed URLs before this version gets their rows from urls (no traceback):
    # a failed URL's due_at is when it failed.
    """
CREATE TABLE failures (
    url_id    INTEGER PRIMARY KEY,  -- urls.url_id
    reason    TEXT    NOT NULL,     -- why it failed (urls.reason then)
    trace     TEXT,                 -- the traceback's last frames (a spider's exception)
    failed_at REAL    NOT NULL
);
INSERT INTO failures(url_id, reason, failed_at)
SELECT url_id, COALESCE(reason, last_error, 'unknown'), due_at FROM urls WHERE state = 'failed';
""",
]

assert len(MIGRATIONS) == SCHEMA_VERSION

_BUSY_TIMEOUT_MS = 60_000
#: Prepared statements the connection keeps (Python's default is 128). A crawl runs ~220
#: distinct statements (an ``IN (...)`` list of each length is one of its own), so with 128 the
#: least recently used were evicted and prepared again within the next lease or commit.
_CACHED_STATEMENTS = 1024
#: The connection's page cache (KiB; SQLite's default is 2,000). A completion batch's links land
#: on random pages of the URL key index and its updates on random URL rows: at 10^6 URLs one
#: batch touches more pages than 2 MB hold, and a page evicted within the batch is read back
#: from the OS. 64 MB: 2.6 % fewer instructions over 40 lease-and-complete cycles at 10^6 URLs
#: (cachegrind), the reads' system calls aside. It fills only as pages are read, and stays
#: valid across this connection's own transactions.
_CACHE_KIB = 65_536
#: WAL pages after which a committing connection checkpoints by itself (SQLite's default is
#: 1,000): only when the checkpoint thread has not kept up (64 MB of WAL).
_BACKSTOP_PAGES = 16_384
#: A WAL file that grew beyond this is truncated back to it when it restarts from its beginning.
_WAL_SIZE_LIMIT = 16 << 20
#: The checkpoint thread runs at most this often (seconds): a checkpoint then covers several
#: commits, and a page they all wrote (host rows, counters, index tails) is copied once.
_CHECKPOINT_INTERVAL = 0.1
#: WAL pages (8 MB) past which a write lets the WAL restart (``_Checkpointer``).
_RESTART_PAGES = 2_048


class _Checkpointer:
    """Checkpoints one database's WAL from a thread and connection of its own.

    ``kick`` (after each write commit) wakes it; it runs ``PRAGMA wal_checkpoint(PASSIVE)``,
    which copies the committed frames no reader still needs into the database file without
    blocking writers or readers, then rests ``_CHECKPOINT_INTERVAL``. The GIL is released while
    SQLite works, so the caller's thread goes on meanwhile.

    SQLite restarts the WAL from its beginning at a write transaction's start only if a
    checkpoint copied all of it; while this process keeps committing, some commit nearly always
    lands during the checkpoint and the file would grow to the backstop. So once a checkpoint
    saw the WAL at ``_RESTART_PAGES`` it sets ``restart_due``, and the frontier's next write,
    right after its COMMIT and still holding its lock, copies the few frames committed since
    (``SQLiteFrontier._run``): the next write then starts the WAL over. (With the thread taking
    the frontier's lock for that itself, the WAL grew to 30-44 MB in ``bench frontier``; likely
    cause: a caller that leases and completes back to back takes the lock again before the
    waiting thread gets the GIL.)
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._kicked = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: Set by the thread, cleared by the write that does the catch-up checkpoint.
        self.restart_due = False
        #: Checkpoints run by the thread, and catch-ups run by writes.
        self.checkpoints = 0
        self.catch_ups = 0

    def kick(self) -> None:
        if self._thread is None:  # started by the first write, not by read-only opens
            self._thread = threading.Thread(
                target=self._main, name="idemcrawl-sqlite-checkpoint", daemon=True
            )
            self._thread.start()
        self._kicked.set()

    def _main(self) -> None:
        try:
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            log.warning("cannot open %s for checkpoints; the connection does them", self._path)
            return
        try:
            # A checkpoint waits for no lock: whatever it cannot do now, the next one does.
            db.execute("PRAGMA busy_timeout=0")
            while True:
                self._kicked.wait()
                if self._stopping.is_set():
                    return
                self._kicked.clear()
                try:
                    _, frames, _ = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if frames >= _RESTART_PAGES:
                        self.restart_due = True
                    self.checkpoints += 1
                except sqlite3.Error as exc:  # busy, or the file went away: try next time
                    log.debug("checkpoint of %s skipped: %s", self._path, exc)
                if self._stopping.wait(_CHECKPOINT_INTERVAL):
                    return
        finally:
            db.close()

    def stop(self) -> None:
        self._stopping.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class SQLiteFrontier(Scheduler):
    """Frontier backend on one SQLite file; safe to share between processes on one machine.

    ``rng`` draws lease tokens and back-off jitter (seed it for a reproducible run).
    """

    def __init__(self, path: str, *, create: bool = True, rng: random.Random | None = None) -> None:
        self.path = path
        _check_path(path, create)
        deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1e3
        while True:
            # A failed attempt closes its own connection: ``self._db`` may not exist yet.
            db: sqlite3.Connection | None = None
            try:
                db = self._db = sqlite3.connect(
                    path,
                    isolation_level=None,
                    check_same_thread=False,
                    timeout=_BUSY_TIMEOUT_MS / 1e3,
                    cached_statements=_CACHED_STATEMENTS,
                )
                self._db.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
                self._refuse_foreign()  # before WAL mode, which would change the file
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA foreign_keys=OFF")
                self._db.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
                self._db.execute(f"PRAGMA wal_autocheckpoint={_BACKSTOP_PAGES}")
                self._db.execute(f"PRAGMA journal_size_limit={_WAL_SIZE_LIMIT}")
                self._migrate()
                break
            except sqlite3.OperationalError as exc:
                # Processes opening a new file together: switching it to WAL and migrating
                # need its exclusive lock, and SQLite answers "locked" at once (no busy wait)
                # where waiting could deadlock. Another process is doing it: try again.
                if db is not None:
                    db.close()
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise FrontierError(f"cannot open crawl database {path!r}: {exc}") from exc
                time.sleep(0.05)
            except sqlite3.DatabaseError as exc:
                if db is not None:
                    db.close()
                raise FrontierError(f"cannot open crawl database {path!r}: {exc}") from exc
            except BaseException:  # our own checks (not a crawl, newer schema)
                if db is not None:
                    db.close()
                raise
        self._lock = threading.Lock()
        self._rng = rng if rng is not None else random.Random()
        self._checkpointer = _Checkpointer(path)

    def migrate(self) -> int:
        """The schema version (opening the file already brought it up to date)."""
        return SCHEMA_VERSION

    def _refuse_foreign(self) -> None:
        """Refuse an SQLite file that is not a crawl before anything changes it.

        Switching to WAL mode rewrites the file's header, so pointing ``--db`` at some other
        program's database must fail first. A crawl being created by another process right now
        is no false alarm: its tables and its ``user_version`` are committed together.
        """
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version == 0 and self._has_tables():
            raise FrontierError(f"{self.path!r} is an SQLite file but not an idemcrawl crawl")

    def _has_tables(self) -> bool:
        query = "SELECT count(*) FROM sqlite_master WHERE type='table'"
        return bool(self._db.execute(query).fetchone()[0])

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
            if version == 0 and self._has_tables():
                raise FrontierError(f"{self.path!r} is an SQLite file but not an idemcrawl crawl")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for stmt in _split_sql(MIGRATIONS[target - 1]):
                    self._db.execute(stmt)
                self._db.execute(f"PRAGMA user_version={target}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _run(
        self,
        fn: Callable[[Any], T],
        *,
        write: bool = True,
        snapshot: bool = False,
        retry: bool = True,
    ) -> T:
        """One transaction: BEGIN IMMEDIATE for a write (the file's write lock, taken up front),
        a deferred BEGIN for a multi-statement read snapshot, autocommit for a single read."""
        begin = "BEGIN IMMEDIATE" if write else "BEGIN" if snapshot else None
        with self._lock:
            if begin is not None:
                self._db.execute(begin)
            try:
                store = SQLStore(self._db.cursor(), SQLITE)
                result = fn(store)
                if write:
                    store.write_counters()
            except BaseException as exc:
                if begin is not None:
                    self._db.execute("ROLLBACK")
                if _read_only(exc):  # e.g. `control` on a file it may only read
                    raise FrontierError(f"crawl database {self.path!r} is read-only") from exc
                raise
            if begin is not None:
                self._db.execute("COMMIT")
            if write:
                ckpt = self._checkpointer
                if ckpt.restart_due:  # the frames since the thread's checkpoint (_Checkpointer)
                    ckpt.restart_due = False
                    ckpt.catch_ups += 1
                    try:
                        self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    except sqlite3.Error as exc:  # committed already: never fail the call here
                        log.debug("checkpoint of %s skipped: %s", self.path, exc)
                ckpt.kick()
            return result

    def close(self) -> None:
        self._checkpointer.stop()
        with self._lock:
            self._db.close()


def _check_path(path: str, create: bool) -> None:
    """Refuse a path that cannot hold this crawl before SQLite touches it (and, for a missing
    or foreign file, creates or changes anything): one clear reason instead of SQLite's
    "unable to open database file" or a failure at the crawl's first write."""
    if os.path.isdir(path):
        example = os.path.join(path, "crawl.db")
        raise FrontierError(f"{path!r} is a directory, not a database file (e.g. {example!r})")
    if os.path.exists(path):
        if create and not os.access(path, os.R_OK | os.W_OK):
            # ``create`` is the crawl's (and migrate's) open: it will write.
            raise FrontierError(f"crawl database {path!r} is read-only")
        return
    if not create:
        raise FrontierError(f"no crawl database at {path!r}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FrontierError(f"cannot create database {path!r}: directory {parent!r} missing")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FrontierError(f"cannot create database {path!r}: directory {parent!r} is read-only")


def _read_only(exc: BaseException) -> bool:
    """SQLite refused a write because the file (or its directory) is read-only."""
    code = getattr(exc, "sqlite_errorcode", None) or 0
    return isinstance(exc, sqlite3.Error) and code & 0xFF == sqlite3.SQLITE_READONLY


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
