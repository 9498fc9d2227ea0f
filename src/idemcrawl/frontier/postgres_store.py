"""The PostgreSQL frontier's store: ``sql.SQLStore`` in the PostgreSQL dialect, with the
operations PostgreSQL does set-based.

Every statement here carries a whole batch as array parameters (``unnest``), so a lease call is
5 statements in 3 round trips (BEGIN with the expiry check, pause flag, level 1 and the
transaction id in one statement; level 2; the grant with its counters and its own check in
one statement, with COMMIT) and a completion batch 10-11 in 3 (``bench frontier``'s trace;
BEGIN goes out with the first statement, and writes whose result nobody reads with the next
statement or COMMIT, ``PgStore._defer``), whatever their size (issue 14): URL inserts
(their hosts' ids read once per host first, schema 6), level 2 for all planned hosts (one
``LATERAL`` statement), the grants, the fenced completion update, host updates, record upserts and
events. Arrays are bound in binary (``pg_arrays.py``), and a pipeline's statements reach the
socket in one write (``pipeline_sending_once``). The connection, transactions and retries are
``postgres.py``'s.
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..politeness import MAX_STREAK_SHIFT
from .base import Completion, NewURL, RequestSpec
from .sql import SQLStore
from .sql_dialect import HOST_COLS, PICK_COLS, POSTGRES, READY_HOSTS, url_cols
from .store import (
    DONE_COLUMNS,
    PICK_COLUMNS,
    URL_COLUMNS,
    Grant,
    HostRow,
    PickRow,
    done_values,
)

if TYPE_CHECKING:
    from psycopg import Cursor

#: Serialises the event-inserting tail of completion transactions, so event ids are handed out
#: in commit order and a reader's ``event_id > cursor`` never skips a late-committing event.
_EVENTS_LOCK = 0x1DEC0E7E

#: A URL row holds its host's id (schema 6): the ids of a batch's hosts are read once per
#: host, and the missing hosts created (in key order) only when some are missing. Read with a
#: row lock: a host this transaction had not locked yet (one that did not exist when it locked
#: its hosts) is locked before any of its URLs is inserted, as ``_INSERT_URLS`` needs.
_HOST_IDS = (
    "SELECT host_key, host_id FROM hosts WHERE host_key = ANY(%b::text[]) "
    "ORDER BY host_key FOR UPDATE"
)
_INSERT_HOSTS = (
    "INSERT INTO hosts (host_key) SELECT h FROM unnest(%b::text[]) AS l(h) "
    "ORDER BY 1 ON CONFLICT DO NOTHING"
)
#: Insert-if-absent (I1) by the URL key (schema 9: a b-tree on ``url_key_of(url)``, not
#: unique) and the text. Safe without a unique constraint because every transaction that
#: inserts a host's URLs holds that host's row lock to its COMMIT (``lock_hosts``, level 1,
#: ``_HOST_IDS``): a second inserter of the same URL waits for the lock, and its INSERT, a
#: later statement, takes its snapshot after the first one committed (READ COMMITTED), so it
#: sees the row. ``OFFSET 0`` keeps the test a per-row probe of ``urls_key`` (as an anti-join
#: the planner may hash the whole table). A URL twice in one batch is sent once: rows the
#: statement inserts are not visible to its own NOT EXISTS.
_INSERT_URLS = (
    "INSERT INTO urls (url, host_id, state, reason, priority, depth, due_at, discovered_at, "
    "kind, hops) SELECT u, h, s, r, p, d, %s, %s, k, n "
    "FROM unnest(%b::text[], %b::int[], %b::text[], %b::text[], %b::int[], %b::int[], "
    "%b::text[], %b::int[]) AS l(u, h, s, r, p, d, k, n) "
    "WHERE NOT EXISTS (SELECT 1 FROM urls AS x WHERE x.url_key = url_key_of(l.u) "
    "AND x.url = l.u OFFSET 0)"
)
#: A URL's row by its text, through ``urls_key`` (schema 9): ``SQLStore``'s ``WHERE url = ?``
#: would read the whole table now that no index holds the text's hash alone.
_BY_URL = "url_key = url_key_of(%s) AND url = %s"

#: The hosts a writer takes, in key order (``lock_hosts``), with each host's id first.
_LOCK_HOSTS = (
    f"SELECT host_id, {HOST_COLS} FROM hosts WHERE host_key = ANY(%b::text[]) "
    "ORDER BY host_key {lock}"
)

#: Whether a picked URL has a request spec (I11), with its row: the lease call then reads
#: specs only for the URLs that have one (``PgStore.requests_of``), not in a statement of its
#: own for every call. One probe of ``requests``' key per row (an empty index in a crawl of
#: plain GETs).
_HAS_SPEC = "EXISTS (SELECT 1 FROM requests AS r WHERE r.url_id = p.url_id)"
#: Level 2 for every planned host in one statement: each host's best due page URLs, locked,
#: skipping rows another leaser holds (one statement per host took 257 round trips per lease
#: call), each with ``_HAS_SPEC``. The outer ORDER BY keeps each host's rows in pick order.
_PICK_URLS = (
    f"SELECT w.host_key, {', '.join('p.' + c for c in PICK_COLUMNS)}, {_HAS_SPEC} "
    "FROM unnest(%b::text[], %b::int[]) WITH ORDINALITY AS w(host_key, n, ord) "
    "JOIN hosts AS h ON h.host_key = w.host_key "
    f"CROSS JOIN LATERAL (SELECT {PICK_COLS}, priority FROM urls "
    "WHERE urls.host_id = h.host_id AND state = 'queued' AND due_at <= %s "
    "AND kind <> 'robots' ORDER BY priority DESC, due_at LIMIT w.n FOR UPDATE SKIP LOCKED) AS p "
    "ORDER BY w.ord, p.priority DESC, p.due_at"
)

#: Level 1 as ``sql_dialect.READY_HOSTS``, with each host's id first: the rest of the lease
#: call (level 2, the lease log, the hosts' tokens) then finds the hosts by id, not by key.
_READY_HOSTS_IDS = POSTGRES.sql(READY_HOSTS).replace("SELECT ", "SELECT host_id, ", 1)
assert _READY_HOSTS_IDS.startswith("SELECT host_id, host_key, ")
#: The start of a lease call in one statement (``PgStore.first_ready_hosts``): whether a
#: lease has expired (``SQLStore.expired_leases``' predicate) or the crawl is paused, and,
#: only when neither holds, level 1 (``_READY_HOSTS_IDS``): one row of flags and NULL host
#: columns when nothing is ready. The three took three statements in three round trips; the
#: expiry check is nearly always a no-op (one probe of ``urls_leases``), as is the flag (one
#: of ``meta``'s key). ``OFFSET 0`` keeps the flags one row evaluated once: pulled up, both
#: probes were copied into level 1's gate and ran twice. With the hosts it returns the
#: transaction's id (which their row locks assigned anyway), so that the grant can go out
#: with COMMIT: a commit whose acknowledgement is lost is then still looked up by its id.
_LEASE_START = (
    "SELECT x.expired OR x.paused, "
    "CASE WHEN r.host_id IS NOT NULL THEN pg_current_xact_id()::text END, r.* "
    "FROM (SELECT EXISTS (SELECT 1 FROM urls "
    "WHERE state = 'leased' AND lease_expires_at <= %s) AS expired, "
    "EXISTS (SELECT 1 FROM meta WHERE key = 'paused' AND value = '1') AS paused OFFSET 0) AS x "
    "LEFT JOIN LATERAL ("
    + _READY_HOSTS_IDS.replace(
        " FROM hosts WHERE ", " FROM hosts WHERE NOT (x.expired OR x.paused) AND ", 1
    )
    + ") AS r ON true"
)
assert "WHERE NOT (x.expired OR x.paused) AND " in _LEASE_START
#: ``_PICK_URLS`` for hosts whose ids level 1 read: no lookup of each host by its key
#: (the join took a quarter of the statement); rows come back with the host's position.
#: The arrays are sub-selects, so that no plan knows their length: with it, every plan for
#: the few hosts of a call looked cheaper than the generic one, and the statement was
#: planned again on every call (pg_stat_statements: 0.31 ms of planning for 0.14 ms of
#: execution, ``bench crawl``, session 11).
_PICK_URLS_BY_ID = (
    f"SELECT w.ord, {', '.join('p.' + c for c in PICK_COLUMNS)}, {_HAS_SPEC} "
    "FROM unnest((SELECT %b::int[]), (SELECT %b::int[])) WITH ORDINALITY AS w(host_id, n, ord) "
    f"CROSS JOIN LATERAL (SELECT {PICK_COLS}, priority FROM urls "
    "WHERE urls.host_id = w.host_id AND state = 'queued' AND due_at <= %s "
    "AND kind <> 'robots' ORDER BY priority DESC, due_at LIMIT w.n FOR UPDATE SKIP LOCKED) AS p "
    "ORDER BY w.ord, p.priority DESC, p.due_at"
)
_LEASE_LOG_COLUMNS = (
    "(host_id, url_id, kind, granted_at, eligible_at, min_gap, allowance, in_flight_before)"
)
_LEASE_LOG_BY_KEY = (
    f"INSERT INTO lease_log {_LEASE_LOG_COLUMNS} "
    "SELECT (SELECT host_id FROM hosts WHERE host_key = g.host), g.url_id, "
    "g.kind, g.granted_at, g.eligible_at, g.min_gap, "
    "g.allowance, g.in_flight FROM unnest(%b::float8[], %b::text[], %b::bigint[], "
    "%b::text[], %b::float8[], %b::float8[], %b::int[], %b::int[]) WITH ORDINALITY "
    "AS g(granted_at, host, url_id, kind, eligible_at, min_gap, allowance, "
    "in_flight, n) ORDER BY g.n"
)
_LEASE_LOG_BY_ID = (
    f"INSERT INTO lease_log {_LEASE_LOG_COLUMNS} "
    "SELECT g.host, g.url_id, g.kind, g.granted_at, g.eligible_at, g.min_gap, "
    "g.allowance, g.in_flight FROM unnest(%b::float8[], %b::int[], %b::bigint[], "
    "%b::text[], %b::float8[], %b::float8[], %b::int[], %b::int[]) WITH ORDINALITY "
    "AS g(granted_at, host, url_id, kind, eligible_at, min_gap, allowance, "
    "in_flight, n) ORDER BY g.n"
)
#: The hosts' tokens and budgets, and the counts of the URLs the grant moved from queued to
#: leased (``n`` per host), in one write of each host row: the count trigger skips the
#: grant's UPDATE of urls (``_grant_sql``), which used to write every granted host once more
#: (schema 9).
_GRANT_HOSTS = (
    "UPDATE hosts AS h SET next_allowed_at = g.next_allowed_at, "
    "budget_used = g.used, budget_day = g.day, queued = h.queued - g.n, "
    "in_flight = h.in_flight + g.n "
    "FROM unnest(%b::{key}[], %b::float8[], %b::int[], %b::text[], %b::int[]) "
    "AS g(host, next_allowed_at, used, day, n) WHERE h.{column} = g.host"
)
#: The grant's URL rows, found through ``urls_pkey`` by the redundant ``url_id = ANY(ids)``
#: whatever the statistics say. With ``u.state = 'queued'`` written as a constant and no other
#: bound on ``u``, a plan made while the statistics counted few queued URLs (a crawl analyzed
#: early, as a growing crawl is) walked all of ``urls_queue`` and hashed it against the batch:
#: 3-11 ms for 8-44 grants at 6,000-10,000 queued URLs, 40 % of the crawl's server time
#: (auto_explain, docs/benchmarks.md, session 9). The constant comes from the batch
#: (``OFFSET 0`` keeps it there), so ``urls_queue``'s predicate never matches: only the
#: primary key bounds the scan.
_GRANT_URLS = (
    "UPDATE urls AS u SET state = 'leased', lease_owner = %s, "
    "lease_token = g.token, lease_expires_at = %s, leased_at = %s "
    "FROM (SELECT *, 'queued'::text AS queued FROM unnest(%b::bigint[], %b::bigint[]) "
    "AS l(url_id, token) OFFSET 0) AS g "
    "WHERE u.url_id = ANY(%b::bigint[]) AND u.url_id = g.url_id AND u.state = g.queued"
)
#: Schema 9's ``urls_count_update`` does nothing while this transaction-local setting is
#: 'on': the statements that count their own URLs, the completion's fenced update
#: (``finish``) and the grant, set it themselves (the trigger fires at the statement's end),
#: and the statement after them in the same pipeline sets it back.
_COUNTED = "SELECT set_config('idemcrawl.counted', %s, true)"
#: The grant's per-state totals (the trigger's ``url_states`` upsert, in state order).
_GRANT_STATES = (
    "INSERT INTO url_states AS t (state, shard, n) "
    "VALUES ('leased', pg_backend_pid(), %s), ('queued', pg_backend_pid(), %s) "
    "ON CONFLICT (state, shard) DO UPDATE SET n = t.n + excluded.n"
)
_GRANT_HOSTS_BY_KEY = _GRANT_HOSTS.format(key="text", column="host_key")
_GRANT_HOSTS_BY_ID = _GRANT_HOSTS.format(key="int", column="host_id")
#: The counters the transaction bumped so far, in name order (``precommit``'s upsert).
_ADD_COUNTERS = (
    "INSERT INTO counters AS t (name, value) SELECT * FROM unnest(%b::text[], %b::bigint[]) "
    "ON CONFLICT (name) DO UPDATE SET value = t.value + excluded.value"
)


#: How the grant's own check (``_grant_sql``) begins its message; the server reports it inside
#: an "invalid input syntax for type integer" error, which ``postgres.error_message`` unwraps.
GRANT_CHECK = "a grant found"


def _grant_sql(by_id: bool) -> str:
    """The whole grant in one statement (data-modifying CTEs, each run once and to the end
    whether read or not): the URL rows (``_GRANT_URLS``), the lease log, the hosts' tokens,
    budgets and counts, the per-state totals, and the lease call's counters, which it is
    the last write of (``Scheduler._lease``). It checks that every URL row it was given
    moved (I6: each was queued, so the counts it writes are exact) and fails otherwise —
    a cast of the message to ``int``, as plain SQL has no RAISE, so that the statement can
    go out with COMMIT, whose round trip then reports the failure and commits nothing —
    and turns the count trigger off for this statement (``_COUNTED`` turns it on again).
    Six statements in one pipeline before (session 9), and the counters' one more round
    trip; then its own round trip before COMMIT's (session 10)."""
    return (
        f"WITH leased AS ({_GRANT_URLS} RETURNING 1), "
        f"logged AS ({_LEASE_LOG_BY_ID if by_id else _LEASE_LOG_BY_KEY}), "
        f"hosted AS ({_GRANT_HOSTS_BY_ID if by_id else _GRANT_HOSTS_BY_KEY}), "
        f"states AS ({_GRANT_STATES}), "
        f"bumped AS ({_ADD_COUNTERS}) "
        "SELECT CASE WHEN (SELECT count(*) FROM leased) = %s::bigint "
        "THEN set_config('idemcrawl.counted', 'on', true) "
        f"ELSE CAST(format('{GRANT_CHECK} %%s of its %%s URLs queued; its counts would be "
        "wrong, so the transaction is rolled back', (SELECT count(*) FROM leased), %s::bigint)"
        " AS int)"
        "::text END"
    )


_GRANT_BY_ID = _grant_sql(True)
_GRANT_BY_KEY = _grant_sql(False)

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
#: The fenced completion update. ``u.state = c.leased`` is ``u.state = 'leased'`` kept from the
#: planner (``OFFSET 0``: the constant is not pulled up): with statistics analyzed while no URL
#: was leased (a fresh seed) it expects one leased row, walks the partial index ``urls_leases``
#: and joins the batch in a nested loop that unnests all its arrays again for every leased row
#: (115 ms for 256 pages at 10^5 URLs; 0.3 ms per URL looked up by key, as it is now). The
#: redundant ``u.url_id = ANY(ids)`` bounds the scan of ``urls`` by the primary key whatever
#: the statistics say: a plan made on statistics of a smaller crawl read every URL row and
#: hashed it against the batch (a sequential scan of 6,000 rows for 28 pages, ``bench
#: crawl``; auto_explain, docs/benchmarks.md, session 9).
_DONE_SQL = (
    "UPDATE urls AS u SET state = 'done', attempts = 0, lease_owner = NULL, "
    "lease_token = NULL, lease_expires_at = NULL, "
    + ", ".join(
        f"{col} = COALESCE(c.{col}, u.{col})" if keep else f"{col} = c.{col}"
        for col, keep in DONE_COLUMNS
    )
    + " FROM (SELECT *, 'leased'::text AS leased FROM unnest(%b::bigint[], %b::int[], "
    "%b::bigint[], "
    + ", ".join(f"%b::{_DONE_TYPES[col]}[]" for col, _ in DONE_COLUMNS)
    + ") AS l(url_id, version, token, "
    + ", ".join(col for col, _ in DONE_COLUMNS)
    + ") OFFSET 0) AS c WHERE u.url_id = c.url_id AND u.state = c.leased "
    "AND u.version = c.version AND u.lease_token = c.token AND u.url_id = ANY(%b::bigint[]) "
    # The count trigger's setting and the transaction id ride on the returned rows: the
    # statement's AFTER trigger fires once they are all computed, and its writes assigned the
    # id (no row: nothing moved, nothing for the trigger to count, and no id yet).
    "RETURNING c.url_id, c.version, c.token, set_config('idemcrawl.counted', 'on', true), "
    "pg_current_xact_id()::text"
)


def done_params(fenced: Sequence[Completion]) -> tuple[list[Any], ...]:
    """``_DONE_SQL``'s arrays for a batch of distinct leases."""
    values = [done_values(c) for c in fenced]
    columns = [
        [None if v[i] is None else _DONE_CAST[col](v[i]) for v in values]
        for i, (col, _) in enumerate(DONE_COLUMNS)
    ]
    ids = [c.lease.url_id for c in fenced]
    return (
        ids,
        [c.lease.version for c in fenced],
        [c.lease.token for c in fenced],
        *columns,
        ids,
    )


#: PostgreSQL types of the host columns ``update_hosts`` may set (``HOST_COLUMNS``).
_HOST_TYPES = {
    "next_allowed_at": "float8", "in_flight": "int", "queued": "int", "max_in_flight": "int",
    "delay": "float8", "backoff_until": "float8", "error_streak": "int", "latency_ewma": "float8",
    "paused": "int", "pause_reason": "text", "robots_state": "text", "robots_body": "bytea",
    "robots_fetched_at": "float8", "robots_expires_at": "float8", "crawl_delay": "float8",
    "budget_day": "text", "budget_used": "int", "robots_meta": "text", "robots_failures": "int",
    "backoff_reason": "text", "budget": "int",
}  # fmt: skip
_RECORD_TYPES = ("text", "text", "text", "text", "text", "text", "float8", "float8")
_EVENT_TYPES = (
    "bigint", "int", "text", "int", "float8", "text", "int", "int", "text", "bigint", "bigint",
    "text", "float8",
)  # fmt: skip
#: How a Python value becomes an element of a typed array parameter (one array holds one type:
#: an int among floats would otherwise make psycopg pick the wrong element type).
_CASTS: dict[str, Callable[[Any], Any]] = {
    "int": int, "bigint": int, "float8": float, "text": str, "bytea": bytes,
}  # fmt: skip


def _columns(rows: Sequence[Sequence[Any]], types: Sequence[str]) -> list[list[Any]]:
    """Rows turned into one typed list per column, for ``unnest`` of array parameters."""
    return [[None if r[i] is None else _CASTS[t](r[i]) for r in rows] for i, t in enumerate(types)]


def _arrays(types: Sequence[str]) -> str:
    return ", ".join(f"%b::{t}[]" for t in types)


#: Set-based twins of ``sql_dialect.UPSERT_RECORD`` and ``INSERT_EVENT``: one statement for a
#: completion batch instead of one per page (events in batch order: ids follow it).
_UPSERT_RECORDS = (
    "INSERT INTO records (record_id, source, key, url, data, content_hash, first_seen, "
    f"last_changed) SELECT * FROM unnest({_arrays(_RECORD_TYPES)}) "
    "ON CONFLICT (record_id) DO UPDATE SET data = excluded.data, "
    "content_hash = excluded.content_hash, last_changed = excluded.last_changed, "
    "url = excluded.url WHERE records.content_hash IS DISTINCT FROM excluded.content_hash"
)
_INSERT_EVENTS = (
    "INSERT INTO events (url_id, url_version, url, status, fetched_at, content_hash, records, "
    "links, warc_file, warc_offset, warc_length, payload_digest, created_at) "
    "SELECT u, v, l, s, f, c, r, k, wf, wo, wl, pd, ca "
    f"FROM unnest({_arrays(_EVENT_TYPES)}) WITH ORDINALITY "
    "AS e(u, v, l, s, f, c, r, k, wf, wo, wl, pd, ca, n) ORDER BY e.n "
    "ON CONFLICT (url_id, url_version) DO NOTHING"
)


#: ``Store.stale_tables``: the server's counters (every process's changes, kept whether or not
#: autovacuum runs) against the row count the last analyze found (-1 before the first one).
#: Read for this schema's tables only: the ``pg_stat_user_tables`` view fetches the counters of
#: every table of the database.
_STALE_TABLES = (
    "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
    "AND relkind = 'r' "
    "AND pg_stat_get_mod_since_analyze(oid) >= GREATEST(%s, %s * GREATEST(reltuples, 0)) "
    "ORDER BY 1"
)


def _psycopg_pipeline_hooks() -> Any:
    """psycopg's ``send`` generator if its pipeline has the two methods ``_send_at_sync``
    replaces and calls (``_communicate_gen``, ``_fetch_gen(flush=...)``, psycopg 3.1 to 3.3);
    None otherwise, and pipelines then send the way psycopg does."""
    try:
        import inspect

        from psycopg import Pipeline
        from psycopg.generators import send
    except ImportError:
        return None
    fetch = getattr(Pipeline, "_fetch_gen", None)
    if not callable(getattr(Pipeline, "_communicate_gen", None)) or not callable(fetch):
        return None
    if "flush" not in inspect.signature(fetch).parameters:
        return None
    return send


_SEND = _psycopg_pipeline_hooks()


@contextlib.contextmanager
def pipeline_sending_once(conn: Any) -> Iterator[Any]:
    """``conn.pipeline()`` whose statements reach the socket together, at the pipeline's Sync
    or when a result is read, instead of one ``send()`` each.

    psycopg flushes libpq's buffer after every statement it queues in a pipeline. Each flush is
    a ``send()`` on the socket, made with the GIL held (the event loop waits for it), and each
    wakes the server process for a message or two: a commit of 11 statements in 3 round trips
    was 17 sends. A 20,000-page PostgreSQL crawl made 13,377 sends for ~3,500 round trips;
    with this 4,806 (``strace -c``), and in a micro-benchmark a pipeline of 11 statements cost
    the client 243 µs of CPU instead of 587 and the server 85 µs instead of 309
    (docs/benchmarks.md, session 17). libpq still sends on its own once its buffer passes 8 kB.
    This replaces a method of psycopg's pipeline (``_SEND`` says whether the installed psycopg
    has it as expected; docs/decisions.md).
    """
    with conn.pipeline() as pipeline:
        if _SEND is not None:
            pipeline._communicate_gen = types.MethodType(_send_at_sync, pipeline)
        yield pipeline


def _send_at_sync(pipeline: Any) -> Any:
    """A psycopg pipeline's ``_communicate_gen``: hand the queued statements to libpq, which
    buffers them (pipeline mode), and flush only when a Sync is among them; then read every
    outstanding result, so that psycopg's own exit asks for none with a Flush message of its
    own. A statement whose result is read before the Sync is flushed by psycopg's fetch."""
    queue = pipeline.command_queue
    sync = pipeline.pgconn.pipeline_sync
    synced = False
    while queue:
        command = queue.popleft()
        command()
        synced = synced or command == sync
    if synced:
        yield from _SEND(pipeline.pgconn)
        yield from pipeline._fetch_gen(flush=False)


class _Cursor:
    """The transaction's cursor as the store's statements see it: a statement first sends the
    writes the store deferred (``PgStore._defer``) and the transaction's BEGIN, in the same
    pipeline, so they run in the order they were made and cost no round trip of their own."""

    __slots__ = ("_cur", "_store")

    def __init__(self, cur: Cursor[Any], store: PgStore) -> None:
        self._cur = cur
        self._store = store

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        store = self._store
        if not store._later and store._begin is None:
            return self._cur.execute(query, params, **kw)
        with store._pipeline():
            store._send_later()
            self._cur.execute(query, params, **kw)
        return self._cur

    def executemany(self, query: Any, params_seq: Any, **kw: Any) -> None:
        self._store.flush()
        self._cur.executemany(query, params_seq, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


class PgStore(SQLStore):
    """``sql.SQLStore`` in the PostgreSQL dialect, with its set-based statements."""

    def __init__(self, cur: Cursor[Any], pipelines: bool, begin: str | None = None) -> None:
        super().__init__(_Cursor(cur, self), POSTGRES)
        self._pipelines = pipelines
        #: Writes whose results nobody reads (host state, records, events, the end of the
        #: completion's counting), sent ahead of the transaction's next statement: a commit
        #: is then 3 round trips, not 9 (lock and fence, links, the counters with COMMIT).
        self._later: list[tuple[str, Sequence[Any]]] = []
        #: The transaction's BEGIN until it is sent, ahead of the first statement in the same
        #: round trip (the frontier's connection is in autocommit mode): psycopg's own BEGIN
        #: is a round trip of its own. None: sent, or the caller runs the transaction.
        self._begin = begin
        self._raw = cur
        #: host_key -> host_id of the hosts this transaction read (level 1, lock_hosts).
        self._host_id: dict[str, int] = {}
        #: URLs per state this transaction moved and counted itself (``finish``), for
        #: ``precommit`` to add to ``url_states``; the triggers count every other move.
        self._states: Counter[str] = Counter()
        #: URLs level 2 picked in this transaction that have no request spec (``_HAS_SPEC``):
        #: ``requests_of`` reads none for them. Specs are written with their URL only (I11).
        self._plain: set[int] = set()
        #: The transaction's id, once a statement that needs one anyway returned it (level 1's
        #: row locks, the completion's fence): ``precommit`` then needs no round trip and the
        #: last statement goes out with COMMIT (``commit``).
        self._xid: str | None = None

    def _pipeline(self) -> contextlib.AbstractContextManager[Any]:
        """Statements whose results are not needed go out in one round trip (libpq 14+;
        with an older libpq the same statements simply run one by one), in one write to the
        socket where psycopg allows it (``pipeline_sending_once``)."""
        if self._pipelines:
            return pipeline_sending_once(self._raw.connection)
        return contextlib.nullcontext()

    def _defer(self, query: str, params: Sequence[Any]) -> None:
        """Run ``query`` before the transaction's next statement (``_Cursor``) or ``flush``.
        Only for writes whose result is not read and whose rows the statements in between
        do not read: every statement sends them first, so their order is kept."""
        self._later.append((query, params))

    def _send_later(self) -> None:
        if self._begin is not None:
            self._raw.execute(self._begin)
            self._begin = None
        later, self._later = self._later, []
        for query, params in later:
            self._raw.execute(query, params)

    def flush(self) -> None:
        """Send the deferred writes (and BEGIN) now, in one pipeline."""
        if self._later or self._begin is not None:
            with self._pipeline():
                self._send_later()

    def commit(self) -> None:
        """COMMIT, with the writes still deferred in the same round trip (the grant, the
        counters); nothing when the transaction never sent a statement."""
        if self._begin is not None and not self._later:
            return
        while self._later and self._later[-1][0] == _COUNTED:
            # The count trigger's setting back, last: the setting is the transaction's own
            # and ends with it (a statement fewer for every lease call).
            self._later.pop()
        with self._pipeline():
            self._send_later()
            self._raw.execute("COMMIT")

    def insert_urls(self, urls: Sequence[NewURL], now: float) -> int:
        """Insert-if-absent in one statement (``_INSERT_URLS``); returns how many were new.
        The first occurrence of a URL in the batch is the one inserted, as with ON CONFLICT
        DO NOTHING before schema 9."""
        if not urls:
            return 0
        ids = self.host_ids(sorted({u.host_key for u in urls}))
        first: dict[str, NewURL] = {}
        for u in urls:
            first.setdefault(u.url, u)
        urls = list(first.values())
        self.cur.execute(
            _INSERT_URLS,
            (
                float(now),
                float(now),
                [u.url for u in urls],
                [ids[u.host_key] for u in urls],
                [u.state for u in urls],
                [u.reason for u in urls],
                [int(u.priority) for u in urls],
                [int(u.depth) for u in urls],
                [u.kind for u in urls],
                [int(u.hops) for u in urls],
            ),
        )
        return max(self.cur.rowcount, 0)

    def host_ids(self, keys: Sequence[str]) -> dict[str, int]:
        """The ids of the hosts ``keys`` (sorted), creating the missing rows first. Ids this
        transaction already read (``lock_hosts``, level 1) are not read again: a completion
        batch has locked the hosts of its links before it inserts them."""
        known = self._host_id
        ids = {k: known[k] for k in keys if k in known}
        unread = [k for k in keys if k not in ids]
        if unread:
            ids.update((k, int(i)) for k, i in self.cur.execute(_HOST_IDS, (unread,)).fetchall())
        missing = [k for k in unread if k not in ids]
        if missing:
            self.cur.execute(_INSERT_HOSTS, (missing,))
            ids.update((k, int(i)) for k, i in self.cur.execute(_HOST_IDS, (missing,)).fetchall())
        return ids

    def claim_url(self, url: str) -> tuple[int, str, str] | None:
        row = self.cur.execute(
            f"SELECT url_id, state, kind FROM urls WHERE {_BY_URL} FOR UPDATE SKIP LOCKED",
            (url, url),
        ).fetchone()
        return None if row is None else (int(row[0]), row[1], row[2])

    def redirect_target(self, url: str) -> str | None:
        row = self.cur.execute(
            f"SELECT redirect_to FROM urls WHERE {_BY_URL}", (url, url)
        ).fetchone()
        return None if row is None else row[0]

    def existing_urls(self, candidates: Sequence[str]) -> set[str]:
        rows = self.cur.execute(
            "SELECT l.u FROM unnest(%b::text[]) AS l(u) WHERE EXISTS (SELECT 1 FROM urls AS x "
            "WHERE x.url_key = url_key_of(l.u) AND x.url = l.u OFFSET 0)",
            (list(candidates),),
        ).fetchall()
        return {r[0] for r in rows}

    def insert_requests(self, rows: Sequence[tuple[str, RequestSpec]]) -> None:
        self.cur.executemany(
            "INSERT INTO requests(url_id, method, callback, data, headers, body, render) "
            f"SELECT url_id, %s, %s, %s, %s, %s, %s FROM urls WHERE {_BY_URL} "
            "ON CONFLICT DO NOTHING",
            [
                (r.method, r.callback, r.data, r.headers, r.body, int(r.render), key, key)
                for key, r in rows
            ],
        )

    def url_row(self, url: str) -> dict[str, Any] | None:
        rows = self._dicts(
            f"SELECT {url_cols(URL_COLUMNS)} FROM urls WHERE {_BY_URL.replace('%s', '?')}",
            (url, url),
            URL_COLUMNS,
        )
        return rows[0] if rows else None

    def lock_hosts(
        self, keys: Iterable[str], *, read: Iterable[str] = (), skip_locked: bool = False
    ) -> dict[str, HostRow]:
        """``SQLStore.lock_hosts`` (in key order, one statement), keeping the ids of every
        host it locked for ``host_ids``."""
        wanted, ordered = self._lock_order(keys, read)
        if not ordered:
            return {}
        lock = "FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE"
        rows = self.cur.execute(_LOCK_HOSTS.format(lock=lock), (ordered,)).fetchall()
        return self._locked(rows, wanted)

    def _locked(self, rows: Sequence[Sequence[Any]], wanted: set[str]) -> dict[str, HostRow]:
        """The rows ``_LOCK_HOSTS`` returned: their ids kept, those ``wanted`` returned."""
        self._host_id.update((r[1], int(r[0])) for r in rows)
        return {r[1]: HostRow(*r[1:]) for r in rows if r[1] in wanted}

    def first_ready_hosts(self, now: float, max_in_flight: int, limit: int) -> list[HostRow] | None:
        """The lease call's expiry check, pause flag and level 1 in one statement
        (``_LEASE_START``)."""
        rows = self.cur.execute(
            _LEASE_START, (now, now, now, max_in_flight, MAX_STREAK_SHIFT, now, limit)
        ).fetchall()
        if rows[0][0]:
            return None  # a lease expired, or the crawl is paused: the steps one by one
        if rows[0][1] is None:
            return []  # no host is ready (the LEFT JOIN's row)
        self._xid = rows[0][1]
        self._host_id.update((r[3], int(r[2])) for r in rows)
        return [HostRow(*r[3:]) for r in rows]

    def ready_hosts(self, now: float, max_in_flight: int, limit: int) -> list[HostRow]:
        """Level 1 (``sql_dialect.READY_HOSTS``), keeping the ids of the hosts it read."""
        rows = self.cur.execute(
            _READY_HOSTS_IDS,
            (now, now, max_in_flight, MAX_STREAK_SHIFT, now, limit),
        ).fetchall()
        self._host_id.update((r[1], int(r[0])) for r in rows)
        return [HostRow(*r[1:]) for r in rows]

    def pick_urls(
        self, wants: Sequence[tuple[str, int, Sequence[int]]], now: float
    ) -> dict[str, list[PickRow]]:
        """All hosts' picks in one statement (``_PICK_URLS``, by id when level 1 read them all);
        rows picked in an earlier round of this lease call are asked for again and dropped
        here, as ``SQLStore`` does."""
        out: dict[str, list[PickRow]] = {key: [] for key, _, _ in wants}
        if not wants:
            return out
        keys = [k for k, _, _ in wants]
        counts = [n + len(ex) for _, n, ex in wants]
        ids = self._ids(keys)
        if ids is None:
            rows = self.cur.execute(_PICK_URLS, (keys, counts, float(now))).fetchall()
        else:
            rows = [
                (keys[r[0] - 1], *r[1:])
                for r in self.cur.execute(_PICK_URLS_BY_ID, (ids, counts, float(now))).fetchall()
            ]
        limits = {key: (n, set(ex)) for key, n, ex in wants}
        plain = self._plain
        for r in rows:
            key = r[0]
            if not r[-1]:
                plain.add(r[1])
            n, skip = limits[key]
            picked = out[key]
            if len(picked) < n and r[1] not in skip:
                picked.append(tuple(r[1:-1]))
        return out

    def requests_of(self, url_ids: Sequence[int]) -> dict[int, RequestSpec]:
        """``SQLStore.requests_of`` for the URLs level 2 did not already find without a spec:
        none of a lease call's picks in a crawl of plain GETs, so no statement."""
        plain = self._plain
        ask = [i for i in url_ids if i not in plain]
        return super().requests_of(ask) if ask else {}

    def _ids(self, keys: Sequence[str]) -> list[int] | None:
        """The ids of ``keys`` if this transaction read every one of them (level 1, a lock)."""
        known = self._host_id
        if not all(k in known for k in keys):
            return None
        return [known[k] for k in keys]

    def grant(self, grants: Sequence[Grant], owner: str, now: float, expires: float) -> None:
        """The grant in one statement (``_grant_sql``) with the count trigger's setting back,
        the counters bumped so far with it; deferred (``_defer``): a lease call's grant is
        its last write, and goes out with COMMIT (``commit``)."""
        leases = [(g, i, ls) for g in grants for i, ls in enumerate(g.leases)]
        # Every granted host came from level 1, so normally by id (the hosts_host_id integer
        # index, not the text key's); the key spellings stay for any other caller.
        host_ids = self._ids([g.host_key for g in grants])
        if host_ids is None:
            hosts: list[Any] = [g.host_key for g in grants]
            per_lease: list[Any] = [g.host_key for g, _, _ in leases]
        else:
            hosts = host_ids
            per_lease = [h for h, g in zip(host_ids, grants, strict=True) for _ in g.leases]
        ids = [ls.url_id for _, _, ls in leases]
        names = sorted(self.bumps)
        # Every granted URL is queued and locked by this transaction (level 2's picks, the
        # robots.txt claim), so the grant moves len(g.leases) URLs of each host from queued
        # to leased: it writes those counts with the host's token, and the count trigger
        # skips its UPDATE of urls. ``state = 'queued'`` and the row count the statement
        # checks keep the counts exact (I6) should that ever not hold.
        self._defer(
            _GRANT_BY_KEY if host_ids is None else _GRANT_BY_ID,
            (
                owner,
                expires,
                now,
                ids,
                [ls.token for _, _, ls in leases],
                ids,
                [float(ls.start_at or now) for _, _, ls in leases],
                per_lease,
                ids,
                [ls.kind for _, _, ls in leases],
                [float(ls.due_at) for _, _, ls in leases],
                [float(g.min_gap) for g, _, _ in leases],
                [g.allowance for g, _, _ in leases],
                [g.in_flight + i for g, i, _ in leases],
                hosts,
                [float(g.next_allowed_at) for g in grants],
                [g.budget_used for g in grants],
                [g.budget_day for g in grants],
                [len(g.leases) for g in grants],
                len(leases),
                -len(leases),
                names,
                [self.bumps[n] for n in names],
                len(leases),
                len(leases),
            ),
        )
        self._defer(_COUNTED, ("off",))
        self.bumps.clear()

    def finish(self, completions: Sequence[Completion]) -> list[bool]:
        """The lease fence for the whole batch in one statement (``_send_fence``)."""
        return self.lock_and_finish((), (), completions)[1]

    def lock_and_finish(
        self, keys: Iterable[str], read: Iterable[str], completions: Sequence[Completion]
    ) -> tuple[dict[str, HostRow], list[bool]]:
        """The lock of the hosts (``lock_hosts``) and the fence in one pipeline: one round
        trip; the lock still runs first (every writer locks its hosts before its URLs)."""
        wanted, ordered = self._lock_order(keys, read)
        # Cursors of their own: their rows are read after the pipeline.
        conn = self._raw.connection
        locked = conn.cursor() if ordered else None
        done_cur = conn.cursor()
        with self._pipeline():
            self._send_later()
            if locked is not None:
                locked.execute(_LOCK_HOSTS.format(lock="FOR UPDATE"), (ordered,))
            first = self._send_fence(done_cur, completions)
        rows = {} if locked is None else self._locked(locked.fetchall(), wanted)
        accepted = self._read_fence(done_cur, completions, first)
        return rows, accepted

    def _send_fence(
        self, cur: Cursor[Any], completions: Sequence[Completion]
    ) -> dict[tuple[int, int, int], int]:
        """Send the fenced update of the batch on ``cur``; returns each distinct lease's first
        position. Within a batch only the first of identical leases can be accepted (as one
        by one, the second would find it done).

        The completion counts its own URLs (schema 9's ``_COUNTED``, as the grant does): every
        row the fenced update returns went from leased to done, so each accepted completion
        takes one from its host's in_flight, written with the host's politeness state
        (``update_hosts``) or else at ``precommit``, and moves one URL from leased to done in
        ``url_states`` (``precommit``). The count trigger skips the statement: its scan of the
        transition tables and its own write of every completed host (a second row version per
        host and commit) were 4 % of a crawl's server time (session 9)."""
        first: dict[tuple[int, int, int], int] = {}
        for i, c in enumerate(completions):
            first.setdefault((c.lease.url_id, c.lease.version, c.lease.token), i)
        fenced = [completions[i] for i in first.values()]
        cur.execute(_DONE_SQL, done_params(fenced))
        # The trigger counts the transaction's later updates of urls again; this goes out
        # ahead of the next statement.
        self._defer(_COUNTED, ("off",))
        return first

    def _read_fence(
        self,
        cur: Cursor[Any],
        completions: Sequence[Completion],
        first: dict[tuple[int, int, int], int],
    ) -> list[bool]:
        """Which completions the fenced update on ``cur`` accepted, counted (``_send_fence``)."""
        done = cur.fetchall()
        cur.close()
        if done and self._xid is None:
            # The fence wrote, so the transaction has an id: it lets the counters go out
            # with COMMIT (``precommit``) and a lost acknowledgement be looked up.
            self._xid = done[0][4]
        ok_keys = {(int(r[0]), int(r[1]), int(r[2])) for r in done}
        keys = [(c.lease.url_id, c.lease.version, c.lease.token) for c in completions]
        accepted = [first[key] == i and key in ok_keys for i, key in enumerate(keys)]
        out = self._out_of_flight
        for c, ok in zip(completions, accepted, strict=True):
            if ok:
                out[c.lease.host_key] += 1
        if done:
            self._states["leased"] -= len(done)
            self._states["done"] += len(done)
        return accepted

    def update_hosts(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """All hosts' new values in one statement, sent with the transaction's next one
        (``_defer``). Rows naming a host twice keep the one by one semantics (the last wins)
        by running one by one, as an UPDATE … FROM would apply an arbitrary one of them."""
        keys = [r[-1] for r in rows]
        if not rows:
            return
        if len(set(keys)) < len(keys):
            super().update_hosts(columns, rows)
            return
        if not set(columns) <= set(_HOST_TYPES):
            raise ValueError(f"not host columns: {columns}")
        # By id when this transaction read them all (a completion locked its hosts first).
        ids = self._ids(keys)
        types = [_HOST_TYPES[c] for c in columns] + ["text" if ids is None else "int"]
        names = [f"c{i}" for i in range(len(columns))]
        sets = ", ".join(f"{c} = v.{n}" for c, n in zip(columns, names, strict=True))
        column = "host_key" if ids is None else "host_id"
        params = _columns([r[:-1] for r in rows], types[:-1])
        out = self._out_of_flight
        if out:
            # The leases ``finish`` completed on these hosts leave in_flight in this write.
            sets += ", in_flight = h.in_flight - v.done"
            names.append("done")
            types.insert(-1, "int")
            params.append([out.pop(k, 0) for k in keys])
        params.append(keys if ids is None else ids)
        self._defer(
            f"UPDATE hosts AS h SET {sets} FROM unnest({_arrays(types)}) "
            f"AS v({', '.join(names)}, host) WHERE h.{column} = v.host",
            params,
        )

    def stale_tables(self, min_changes: int, factor: float) -> list[str]:
        rows = self.cur.execute(_STALE_TABLES, (int(min_changes), float(factor))).fetchall()
        return [str(r[0]) for r in rows]

    def analyze(self, tables: Sequence[str], timeout: float) -> None:
        """One ANALYZE for all ``tables``. It takes only a SHARE UPDATE EXCLUSIVE lock, which
        no reader or writer of rows waits for; SKIP_LOCKED passes over a table another
        session is analyzing (or vacuuming) instead of queueing behind it."""
        if not tables:
            return
        self.cur.execute(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}")
        names = ", ".join('"' + t.replace('"', '""') + '"' for t in tables)
        self.cur.execute(f"ANALYZE (SKIP_LOCKED) {names}")

    def upsert_records(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """One statement per batch; a batch writing one record twice runs row by row (one
        upsert statement cannot change a row twice, and the order of the writes matters)."""
        if len(rows) < 2 or len({r[0] for r in rows}) < len(rows):
            super().upsert_records(rows)
            return
        self._defer(_UPSERT_RECORDS, _columns(rows, _RECORD_TYPES))

    def insert_events(self, rows: Sequence[tuple[Any, ...]]) -> None:
        # Last in the transaction and held to COMMIT: ids are handed out in commit order.
        # Both go out with ``precommit``'s statement.
        self._defer("SELECT pg_advisory_xact_lock(%s)", (_EVENTS_LOCK,))
        self._defer(_INSERT_EVENTS, _columns(rows, _EVENT_TYPES))

    def precommit(self) -> str | None:
        """Write what the transaction counted itself and the counters (name order), in one
        statement, and return the transaction id.

        What it counted: the in_flight of hosts whose completed leases no host write took
        (``finish``, ``update_hosts``), and the per-state totals those leases moved, in this
        server process's own ``url_states`` shard as the triggers write them. The id is None
        when the transaction wrote nothing: running it again is then harmless. The outer query
        reads the id only after its FROM has run the writes, so they have assigned one.

        When an earlier statement read the id (``first_ready_hosts``, ``lock_and_finish``),
        the statement is deferred instead: it goes out with COMMIT (``commit``).
        """
        parts: list[str] = []
        params: list[Any] = []
        out = sorted(k for k, n in self._out_of_flight.items() if n)
        if out:
            ids = self._ids(out)
            column, key = ("host_key", "text") if ids is None else ("host_id", "int")
            parts.append(
                "o AS (UPDATE hosts AS h SET in_flight = h.in_flight - d.n "
                f"FROM unnest(%b::{key}[], %b::int[]) AS d(host, n) WHERE h.{column} = d.host "
                "RETURNING 1)"
            )
            params += [out if ids is None else ids, [self._out_of_flight[k] for k in out]]
        states = sorted(st for st, n in self._states.items() if n)
        if states:
            parts.append(
                "s AS (INSERT INTO url_states AS t (state, shard, n) "
                "SELECT d.state, pg_backend_pid(), d.n FROM unnest(%b::text[], %b::bigint[]) "
                "AS d(state, n) ORDER BY 1 "
                "ON CONFLICT (state, shard) DO UPDATE SET n = t.n + excluded.n RETURNING 1)"
            )
            params += [states, [self._states[st] for st in states]]
        if self.bumps:
            names = sorted(self.bumps)
            parts.append(
                "b AS (INSERT INTO counters (name, value) "
                "SELECT * FROM unnest(%b::text[], %b::bigint[]) "
                "ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value "
                "RETURNING 1)"
            )
            params += [names, [self.bumps[n] for n in names]]
        # All of it is in ``params`` now, written once by the statement below.
        self._out_of_flight.clear()
        self._states.clear()
        self.bumps.clear()
        if self._xid is not None:
            if parts:
                # Data-modifying CTEs run to their end whether read or not.
                self._defer(f"WITH {', '.join(parts)} SELECT 1", params)
            return self._xid
        if parts:
            # Each write's count in the FROM: the id is read after all of them ran.
            tables = ", ".join(f"(SELECT count(*) FROM {p[0]}) AS n{p[0]}" for p in parts)
            row = self.cur.execute(
                f"WITH {', '.join(parts)} "
                f"SELECT pg_current_xact_id_if_assigned()::text FROM {tables}",
                params,
            ).fetchone()
        else:
            row = self.cur.execute("SELECT pg_current_xact_id_if_assigned()::text").fetchone()
        return None if row is None else row[0]
