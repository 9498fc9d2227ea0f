"""The neutral SQL both SQL backends speak, and how each engine spells it.

Statements are written once in one spelling; a tiny dialect table (:class:`Dialect`) turns them
into each engine's: ``?`` placeholders (``%s`` on PostgreSQL), ``GREATEST``/``LEAST``
(``MAX``/``MIN`` on SQLite), ``IS DISTINCT FROM`` (``IS NOT``), row locks ``FOR UPDATE [SKIP
LOCKED]`` / ``FOR SHARE`` (nothing on SQLite, whose writers serialise whole transactions), SQLite
planner hints ``INDEXED BY`` (measured wins there; nothing on PostgreSQL), insert-if-absent
``ON CONFLICT DO NOTHING`` (``INSERT OR IGNORE``, faster on SQLite) and ``HAS_WORK``, a host with
queued URLs: ``queued > 0`` on SQLite; on PostgreSQL the stored column ``has_work`` computed from
it, which the ready index's predicate names instead of ``queued``, so that an update of the count
alone changes no indexed column and can be a HOT update (schema 6).

The hot statements of the scheduler's primitives live here too; ``sql.SQLStore`` runs them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .base import NewURL
from .store import DONE_COLUMNS, FAIL_COLUMNS, HOST_COLUMNS, PICK_COLUMNS


@dataclass(frozen=True)
class Dialect:
    """How one engine spells the neutral SQL of this module."""

    name: str
    #: (pattern, replacement) applied in order to every statement.
    rewrites: tuple[tuple[str, str], ...]
    #: ``{in}`` with n values; PostgreSQL passes the values as one array parameter.
    array_param: bool
    #: Writers lock the rows they change (PostgreSQL); else whole transactions serialise.
    row_locks: bool
    #: Most values one statement may bind (SQLite's limit; chunks above it).
    max_params: int = 900
    #: Statements already rewritten (a bounded set: the SQL of this module).
    cache: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def sql(self, text: str) -> str:
        out = self.cache.get(text)
        if out is None:
            out = text
            for pattern, repl in self.rewrites:
                out = re.sub(pattern, repl, out, flags=re.DOTALL)
            self.cache[text] = out
        return out


SQLITE = Dialect(
    "sqlite",
    (
        # Insert-if-absent: with the urls triggers, OR IGNORE takes half the time of the
        # upsert clause (measured: 4.2 s against 7.9 s for 200k URLs).
        (r"^INSERT INTO (.*) ON CONFLICT DO NOTHING$", r"INSERT OR IGNORE INTO \1"),
        (r"\bGREATEST\(", "MAX("),
        (r"\bLEAST\(", "MIN("),
        (r"\bIS DISTINCT FROM\b", "IS NOT"),
        (r" FOR (UPDATE( SKIP LOCKED)?|SHARE)\b", ""),
        (r"\bHAS_WORK\b", "queued > 0"),
    ),
    array_param=False,
    row_locks=False,
)
POSTGRES = Dialect(
    "postgres",
    (
        (r" INDEXED BY \w+", ""),
        (r"%", "%%"),
        (r"\?", "%s"),
        (r"\bHAS_WORK\b", "has_work"),
    ),
    array_param=True,
    row_locks=True,
)


def cols(names: Iterable[str], prefix: str = "") -> str:
    return ", ".join(prefix + n for n in names)


HOST_COLS = cols(HOST_COLUMNS)
PICK_COLS = cols(PICK_COLUMNS)

#: Since schema 6 a URL row names its host by ``host_id`` (4 bytes, not the host key's text,
#: which its queue index repeated too); a read that shows a URL's host key looks it up.
URL_HOST_KEY = "(SELECT host_key FROM hosts WHERE hosts.host_id = urls.host_id)"
#: The host id of a host key, as a scalar subquery (one probe of the hosts key index).
HOST_ID = "(SELECT host_id FROM hosts WHERE host_key = ?)"


def url_cols(names: Iterable[str]) -> str:
    """Columns of ``urls`` for a SELECT, ``host_key`` looked up in ``hosts`` (schema 6)."""
    return ", ".join(f"{URL_HOST_KEY} AS host_key" if n == "host_key" else n for n in names)


#: Level 1 (``scheduler.host_ready`` in SQL, plus "something is due"): the EXISTS goes through
#: urls_queue; planned on urls_state SQLite walks every queued URL per candidate host (6.2 ms at
#: 12k queued, half the SQL thread) instead of 0.04 ms. ``OFFSET 0`` keeps PostgreSQL from
#: turning the EXISTS into a semi-join: joined, it hashes every due URL of the crawl before the
#: first host comes out (690-950 ms per lease call at 10^6 URLs, growing with the frontier);
#: kept a correlated subplan, level 1 is a walk of ``hosts_ready`` in ready order with one
#: urls_queue probe per host it returns (8 ms for 520 hosts), flat in the frontier's size. The
#: probe's ORDER BY is urls_queue's order, so that index answers it: with a bare ``LIMIT 1`` the
#: planner may bet on a sequential scan of urls finding a due row early (22 ms per call with 50
#: hosts x 400 URLs: 11,800 rows read per host; 5.2 ms per lease call in ``bench crawl``).
#: ``paused <> 1`` is ``paused = 0`` (control writes only 0 and 1) spelled for the planner: with
#: no statistics yet (a crawl just seeded, before autovacuum's first ANALYZE) PostgreSQL guesses
#: that ``= 0`` keeps 0.5% of hosts, and then sorts every ready host instead of walking the index.
READY_HOSTS = (
    f"SELECT {HOST_COLS} FROM hosts WHERE HAS_WORK AND next_allowed_at <= ? "
    "AND backoff_until <= ? AND paused <> 1 "
    "AND in_flight < GREATEST(1, COALESCE(max_in_flight, CAST(? AS INTEGER)) "
    ">> LEAST(error_streak, CAST(? AS INTEGER))) "
    "AND EXISTS (SELECT 1 FROM urls u INDEXED BY urls_queue WHERE u.host_id = hosts.host_id "
    "AND u.state = 'queued' AND u.due_at <= ? ORDER BY u.priority DESC, u.due_at LIMIT 1 OFFSET 0) "
    "ORDER BY next_allowed_at LIMIT ? FOR UPDATE SKIP LOCKED"
)

#: The fenced completion update (parameters: ``done_values``, then the fence).
DONE_SET = ", ".join(
    f"{col} = COALESCE(?, {col})" if keep else f"{col} = ?" for col, keep in DONE_COLUMNS
) + (
    ", state = 'done', attempts = 0, lease_owner = NULL, lease_token = NULL, "
    "lease_expires_at = NULL"
)
FENCE = "url_id = ? AND state = 'leased' AND version = ? AND lease_token = ?"
FINISH = f"UPDATE urls SET {DONE_SET} WHERE {FENCE}"
#: Level 2 for many hosts in one statement (SQLite's; ``PgStore`` has its own over ``unnest``):
#: the hosts come as one JSON array of keys (``json_each``: one SQL text whatever the number of
#: hosts, so the statement is prepared once), each host's first ``?`` due queued page URLs by
#: urls_queue's order. SQLite has no LATERAL and no per-row LIMIT, so the hosts of one call are
#: grouped by how many URLs they want (``SQLStore.pick_urls``), and the final ORDER BY puts each
#: host's rows back in the index's order (priority, due time, then url_id, as the index ties).
#: CROSS JOIN fixes the join order: keys, their host ids, then each host's picks. One statement
#: instead of one per host: 1.2 ms against 2.9 ms for 256 hosts at 10^5 URLs (issue 14).
PICK_URLS = (
    f"SELECT j.value, {cols(PICK_COLUMNS, 'u.')} FROM json_each(?) AS j "
    "CROSS JOIN hosts AS h CROSS JOIN urls AS u "
    "WHERE h.host_key = j.value AND u.url_id IN (SELECT q.url_id FROM urls AS q "
    "INDEXED BY urls_queue WHERE q.host_id = h.host_id AND q.state = 'queued' AND q.due_at <= ? "
    "AND q.kind <> 'robots' ORDER BY q.priority DESC, q.due_at LIMIT ?) "
    "ORDER BY j.id, u.priority DESC, u.due_at, u.url_id"
)

UPSERT_RECORD = (
    "INSERT INTO records(record_id, source, key, url, data, content_hash, first_seen, "
    "last_changed) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(record_id) DO UPDATE SET data = excluded.data, "
    "content_hash = excluded.content_hash, last_changed = excluded.last_changed, "
    "url = excluded.url WHERE records.content_hash IS DISTINCT FROM excluded.content_hash"
)
INSERT_EVENT = (
    "INSERT INTO events(url_id, url_version, url, status, fetched_at, content_hash, records, "
    "links, warc_file, warc_offset, warc_length, payload_digest, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(url_id, url_version) DO NOTHING"
)
FAIL_SET = (
    "state = ?, due_at = ?, attempts = attempts + 1, last_error = ?, reason = ?, "
    + ", ".join(f"{c} = COALESCE(?, {c})" for c in FAIL_COLUMNS[4:])
    + ", lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL"
)
LEASE_LOG = (
    "INSERT INTO lease_log(host_id, url_id, kind, granted_at, eligible_at, min_gap, allowance, "
    f"in_flight_before) VALUES ({HOST_ID}, ?, ?, ?, ?, ?, ?, ?)"
)


def url_values(u: NewURL, host_id: int, now: float) -> tuple[Any, ...]:
    """The ``urls`` values of one new URL, in ``SQLStore.insert_urls``' column order."""
    return (u.url, host_id, u.state, u.reason, u.priority, u.depth, now, now, u.kind, u.hops)
