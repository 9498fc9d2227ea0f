"""The frontier's SQL store, written once for SQLite and PostgreSQL.

The statements are in the neutral spelling of ``sql_dialect.py``, which turns them into each
engine's; membership tests ``{in}`` become ``IN (?, …)`` in chunks on SQLite and
``= ANY(%s::type[])`` on PostgreSQL.

:class:`SQLStore` is the :class:`~.store.Store` both SQL backends use; ``postgres.py`` overrides
the operations it does set-based with ``unnest`` and its locking hooks, nothing else.
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from typing import Any

from ..politeness import MAX_STREAK_SHIFT
from .base import (
    STATES,
    Completion,
    Cookie,
    FrontierError,
    FrontierStats,
    Lease,
    NewURL,
    Progress,
    RequestSpec,
)
from .sql_dialect import (
    FAIL_SET,
    FENCE,
    FINISH,
    HOST_COLS,
    HOST_ID,
    INSERT_EVENT,
    LEASE_LOG,
    PICK_COLS,
    PICK_URLS,
    READY_HOSTS,
    SQLITE,
    UPSERT_RECORD,
    URL_HOST_KEY,
    Dialect,
    cols,
    url_cols,
    url_values,
)
from .store import (
    ERROR_COLUMNS,
    FAILURE_COLUMNS,
    HOST_COLUMNS,
    PICK_COLUMNS,
    RECORD_COLUMNS,
    REPARSE_COLUMNS,
    REPORT_COLUMNS,
    STREAMS,
    URL_COLUMNS,
    FailRow,
    Grant,
    HostRow,
    PickRow,
    done_values,
    first_live,
)

#: What URLs of one insert run share (``SQLStore._insert_runs``), and the most runs an insert
#: takes run by run (a batch of more, shorter runs binds every value per row instead).
_URL_SHAPE = operator.attrgetter("state", "reason", "priority", "depth", "kind", "hops")
_MAX_RUNS = 16

#: Level 1 with each host's id first (``SQLStore.ready_hosts`` keeps them for the writes).
_READY_HOSTS_IDS = READY_HOSTS.replace(f"SELECT {HOST_COLS} ", f"SELECT host_id, {HOST_COLS} ", 1)
#: ``progress``: one statement, so one snapshot. ``next_fetch_at IS NOT NULL`` changes no
#: answer (MIN skips NULLs) but bounds the walk of ``urls_refetch`` to the URLs that have a
#: refetch time: a crawl without recrawl has none, and PostgreSQL, planning on statistics
#: taken before any URL was done, aggregated the whole index instead of taking its first
#: entry (5,817 buffers, 2.6 ms a call after 11,000 pages of ``bench crawl``; session 9).
PROGRESS = (
    "WITH t AS (SELECT COALESCE(SUM(queued), 0) AS q, COALESCE(SUM(in_flight), 0) AS l, "
    "MIN(CASE WHEN queued > 0 THEN GREATEST(next_allowed_at, backoff_until) END) AS r, "
    "MIN(CASE WHEN queued > 0 THEN due_hint END) AS d FROM hosts) "
    "SELECT q, l, CASE WHEN q > 0 THEN d END, "
    "CASE WHEN l > 0 THEN "
    "(SELECT MIN(lease_expires_at) FROM urls WHERE state = 'leased') END, r, "
    "(SELECT MIN(next_fetch_at) FROM urls INDEXED BY urls_refetch WHERE state = 'done' "
    "AND next_fetch_at IS NOT NULL) "
    "FROM t"
)
#: ``sql_dialect.PICK_URLS`` for hosts whose ids this transaction read: the JSON array holds
#: the ids, and each row names its host by the array's index.
_PICK_URLS_BY_ID = (
    f"SELECT j.key, {cols(PICK_COLUMNS, 'u.')} FROM json_each(?) AS j "
    "CROSS JOIN urls AS u "
    "WHERE u.url_id IN (SELECT q.url_id FROM urls AS q "
    "INDEXED BY urls_queue WHERE q.host_id = j.value AND q.state = 'queued' AND q.due_at <= ? "
    "AND q.kind <> 'robots' ORDER BY q.priority DESC, q.due_at LIMIT ?) "
    "ORDER BY j.id, u.priority DESC, u.due_at, u.url_id"
)

#: ``_PICK_URLS_BY_ID`` for hosts asking one URL each (every host at one request in flight):
#: each host's best due URL id by a scalar subquery, then its row by rowid, instead of an IN
#: list built per host (0.68 against 1.04 ms for 256 hosts). Rows come in no set order: one
#: per host, named by the array's index.
_PICK_ONE_BY_ID = (
    f"SELECT t.k, {cols(PICK_COLUMNS, 'u.')} FROM (SELECT j.key AS k, "
    "(SELECT q.url_id FROM urls AS q INDEXED BY urls_queue WHERE q.host_id = j.value "
    "AND q.state = 'queued' AND q.due_at <= ? AND q.kind <> 'robots' "
    "ORDER BY q.priority DESC, q.due_at LIMIT 1) AS id FROM json_each(?) AS j) AS t "
    "CROSS JOIN urls AS u ON u.url_id = t.id"
)

#: A NamedTuple of a fetched row's values: ``tuple.__new__`` is what the named tuple's own
#: ``__new__`` ends in, without its Python frame and per-field arguments (0.22 -> 0.15 us a
#: host row; level 1 and a completion read 256-520 of them per call).
_row = tuple.__new__

#: A ``LIMIT`` both engines read as "no limit" (SQLite takes -1, PostgreSQL NULL or ALL).
_NO_LIMIT = 2**62


class SQLStore:
    """One transaction's operations on a DB-API cursor, in a dialect (see ``store.Store``)."""

    def __init__(self, cur: Any, dialect: Dialect) -> None:
        self.cur = cur
        self.dialect = dialect
        self.bumps: Counter[str] = Counter()
        #: host_key -> leases this transaction completed (leased -> done) whose host's
        #: in_flight is not lowered yet: the completion's own host write takes them
        #: (``update_hosts``), ``write_counters`` the rest (SQLite, schema 8).
        self._out_of_flight: Counter[str] = Counter()
        #: host_key -> host_id of the hosts this transaction read (level 1, ``lock_hosts``):
        #: the writes that follow find those hosts by their integer key, not by the text one
        #: (SQLite; ``PgStore`` keeps the same map for its own statements).
        self._host_id: dict[str, int] = {}
        #: SQLite (schema 8): every statement that moves URLs between states counts the moves
        #: into hosts and url_states itself (``_moved``); PostgreSQL's triggers count them.
        self._counting = dialect is SQLITE

    # -- plumbing ------------------------------------------------------------------------------

    def _x(self, query: str, params: Sequence[Any] = ()) -> Any:
        return self.cur.execute(self.dialect.sql(query), params)

    def _xm(self, query: str, rows: Sequence[Sequence[Any]]) -> int:
        """executemany; returns the rows changed (PostgreSQL sends them in one pipeline)."""
        if not rows:
            return 0
        self.cur.executemany(self.dialect.sql(query), rows)
        return max(self.cur.rowcount, 0)

    def _in(
        self,
        query: str,
        values: Sequence[Any],
        before: Sequence[Any] = (),
        after: Sequence[Any] = (),
        *,
        cast: str = "bigint",
    ) -> Iterator[Any]:
        """Run ``query`` whose ``{in}`` tests membership in ``values``; yields its cursor per
        statement (one on PostgreSQL, chunks of SQLite's parameter limit)."""
        d = self.dialect
        if d.array_param:
            yield self._x(
                query.replace("{in}", f"= ANY(?::{cast}[])"), (*before, list(values), *after)
            )
            return
        for i in range(0, len(values), d.max_params):
            chunk = values[i : i + d.max_params]
            marks = "IN (" + ",".join("?" * len(chunk)) + ")"
            yield self._x(query.replace("{in}", marks), (*before, *chunk, *after))

    def _dicts(
        self, query: str, params: Sequence[Any], names: Sequence[str]
    ) -> list[dict[str, Any]]:
        return [dict(zip(names, r, strict=True)) for r in self._x(query, params).fetchall()]

    def _scalar(self, query: str, params: Sequence[Any] = ()) -> Any:
        row = self._x(query, params).fetchone()
        return None if row is None else row[0]

    def bump(self, name: str, n: int) -> None:
        if n:
            self.bumps[name] += n

    def write_counters(self) -> None:
        """The completed leases no host write took yet (``finish``), then the counters, in
        name order, in one statement: the hottest rows, held shortest."""
        out = self._out_of_flight
        if out:
            self._xm(
                "UPDATE hosts SET in_flight = in_flight - ? WHERE host_key = ?",
                [(out[k], k) for k in sorted(out)],
            )
            out.clear()
        names = sorted(self.bumps)
        self._xm(
            "INSERT INTO counters(name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = counters.value + excluded.value",
            [(n, self.bumps[n]) for n in names],
        )

    # -- hosts ---------------------------------------------------------------------------------

    def _lock_order(self, keys: Iterable[str], read: Iterable[str]) -> tuple[set[str], list[str]]:
        """The hosts whose rows a lock returns (``read``), and every host it locks in key order
        (``keys`` and ``read`` with row locks; SQLite's write lock covers the file, so only
        ``read``): writers that lock the same hosts take them in one order, so that two of them
        cannot each hold a lock the other waits for."""
        wanted = set(read)
        return wanted, sorted(set(keys) | wanted if self.dialect.row_locks else wanted)

    def lock_hosts(
        self, keys: Iterable[str], *, read: Iterable[str] = (), skip_locked: bool = False
    ) -> dict[str, HostRow]:
        wanted, ordered = self._lock_order(keys, read)
        out: dict[str, HostRow] = {}
        if not ordered:
            return out
        lock = " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"
        query = (
            f"SELECT host_id, {HOST_COLS} FROM hosts WHERE host_key {{in}} ORDER BY host_key" + lock
        )
        ids = self._host_id
        for cur in self._in(query, ordered, cast="text"):
            for r in cur.fetchall():
                ids[r[1]] = r[0]
                if r[1] in wanted:
                    out[r[1]] = _row(HostRow, r[1:])
        return out

    def ensure_hosts(self, keys: Iterable[str]) -> None:
        self._xm(
            "INSERT INTO hosts(host_key) VALUES (?) ON CONFLICT DO NOTHING", [(k,) for k in keys]
        )

    def update_hosts(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Write ``columns`` of the hosts named last in each row; a host whose completed leases
        are not counted yet (``finish``) has its in_flight lowered by the same write."""
        if not set(columns) <= set(HOST_COLUMNS):
            raise ValueError(f"not host columns: {columns}")
        sets = ", ".join(f"{c} = ?" for c in columns)
        out = self._out_of_flight
        ids = self._host_id
        by_id = bool(rows) and all(r[-1] in ids for r in rows)
        where = "host_id" if by_id else "host_key"
        if out and rows:
            sets += ", in_flight = in_flight - ?"
            rows = [(*r[:-1], out.pop(r[-1], 0), r[-1]) for r in rows]
        if by_id:  # hosts this transaction read: by their integer key
            rows = [(*r[:-1], ids[r[-1]]) for r in rows]
        self._xm(f"UPDATE hosts SET {sets} WHERE {where} = ?", rows)

    # -- leasing -------------------------------------------------------------------------------

    def crawl_paused(self) -> bool:
        return self._scalar("SELECT 1 FROM meta WHERE key = 'paused' AND value = '1'") is not None

    def first_ready_hosts(self, now: float, max_in_flight: int, limit: int) -> list[HostRow] | None:
        """None: SQLite's steps cost no round trip, so the lease call runs them one by one
        (``PgStore`` reads them in one statement)."""
        return None

    def ready_hosts(self, now: float, max_in_flight: int, limit: int) -> list[HostRow]:
        params = (now, now, max_in_flight, MAX_STREAK_SHIFT, now, limit)
        rows = self._x(_READY_HOSTS_IDS, params).fetchall()
        self._host_id.update((r[1], r[0]) for r in rows)
        return [_row(HostRow, r[1:]) for r in rows]

    def pick_urls(
        self, wants: Sequence[tuple[str, int, Sequence[int]]], now: float
    ) -> dict[str, list[PickRow]]:
        """All hosts in one statement per distinct number of rows asked (``PICK_URLS``; in a
        lease call nearly every host asks for the same few); rows picked in an earlier round of
        the call are asked for again and dropped here."""
        out: dict[str, list[PickRow]] = {key: [] for key, _, _ in wants}
        by_limit: dict[int, list[str]] = {}
        for key, n, exclude in wants:
            by_limit.setdefault(n + len(exclude), []).append(key)
        limits = {key: (n, set(exclude)) for key, n, exclude in wants}
        ids = self._host_id
        for limit, keys in sorted(by_limit.items()):
            if limit <= 0:
                continue
            if all(k in ids for k in keys):
                # by id (level 1 read them all): no probe of the hosts' text key per host
                host_ids = json.dumps([ids[k] for k in keys])
                if limit == 1:
                    found = self._x(_PICK_ONE_BY_ID, (now, host_ids)).fetchall()
                else:
                    found = self._x(_PICK_URLS_BY_ID, (host_ids, now, limit)).fetchall()
                rows = [(keys[r[0]], *r[1:]) for r in found]
            else:
                rows = self._x(PICK_URLS, (json.dumps(keys), now, limit)).fetchall()
            for r in rows:
                key = r[0]
                n, skip = limits[key]
                picked = out[key]
                if len(picked) < n and r[1] not in skip:
                    picked.append(r[1:])
        return out

    def mark_disallowed(self, url_ids: Sequence[int], reason: str) -> None:
        """Picked (queued) URLs robots.txt refuses become disallowed."""
        query = self._returning(
            "UPDATE urls SET state = 'disallowed', reason = ? WHERE url_id {in} "
            "AND state = 'queued'"
        )
        for cur in self._in(query, url_ids, (reason,)):
            self._moved_by(cur, "queued")

    def defer_queued(self, host_key: str, reason: str, *, robots_too: bool = False) -> int:
        # INDEXED BY: otherwise SQLite picks the low-selectivity state index and scans every
        # queued URL of the crawl (365 ms at 1.1M queued, vs 0.13 ms).
        cur = self._x(
            self._returning(
                "UPDATE urls INDEXED BY urls_queue SET state = 'deferred', reason = ? "
                f"WHERE host_id = {HOST_ID} AND state = 'queued'"
                + ("" if robots_too else " AND kind <> 'robots'")
            ),
            (reason, host_key),
        )
        return self._moved_by(cur, "queued")

    def claim_url(self, url: str) -> tuple[int, str, str] | None:
        row = self._x(
            "SELECT url_id, state, kind FROM urls WHERE url = ? FOR UPDATE SKIP LOCKED", (url,)
        ).fetchone()
        return None if row is None else (int(row[0]), row[1], row[2])

    def make_robots(self, url_id: int, now: float, *, new_round: bool) -> None:
        if new_round:
            old = self._scalar("SELECT state FROM urls WHERE url_id = ?", (url_id,))
            cur = self._x(
                self._returning(
                    "UPDATE urls SET state = 'queued', kind = 'robots', version = version + 1, "
                    "due_at = ?, reason = NULL WHERE url_id = ?"
                ),
                (now, url_id),
            )
            self._moved_by(cur, old)
        else:
            self._x("UPDATE urls SET kind = 'robots' WHERE url_id = ?", (url_id,))

    def pick_row(self, url_id: int) -> PickRow:
        return tuple(
            self._x(f"SELECT {PICK_COLS} FROM urls WHERE url_id = ?", (url_id,)).fetchone()
        )

    def grant(self, grants: Sequence[Grant], owner: str, now: float, expires: float) -> None:
        """The leases, the lease log and the hosts' tokens; the grants count their URLs' move
        from queued to leased themselves (SQLite's state trigger leaves it to them, schema 8):
        in ``url_states`` in one statement, and in each host's queued/in_flight (I6) in the
        host's token update, which writes the row anyway."""
        leased = self._xm(
            "UPDATE urls SET state = 'leased', lease_owner = ?, lease_token = ?, "
            "lease_expires_at = ?, leased_at = ? WHERE url_id = ? AND state = 'queued'",
            [(owner, ls.token, expires, now, ls.url_id) for g in grants for ls in g.leases],
        )
        # Every lease is a row this transaction picked as queued, under the write lock.
        self._check_moved("granted", sum(len(g.leases) for g in grants), leased)
        self._move_states("queued", "leased", leased)
        ids = self._host_id
        # Normally every granted host came from level 1: by id, and the lease log in multi-row
        # inserts (0.56 -> 0.20 ms for 256 rows; the hosts' update 1.46 -> 1.13 ms).
        by_id = all(g.host_key in ids for g in grants)
        if by_id:
            log: list[Any] = []
            for g in grants:
                h = ids[g.host_key]
                for i, ls in enumerate(g.leases):
                    log += (h, ls.url_id, ls.kind, ls.start_at or now, ls.due_at, g.min_gap,
                            g.allowance, g.in_flight + i)  # fmt: skip
            step = max(1, self.dialect.max_params // 8) * 8
            for i in range(0, len(log), step):
                values = log[i : i + step]
                self.cur.execute(
                    "INSERT INTO lease_log(host_id, url_id, kind, granted_at, eligible_at, "
                    "min_gap, allowance, in_flight_before) VALUES "
                    + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * (len(values) // 8)),
                    values,
                )
        else:
            self._xm(
                LEASE_LOG,
                [
                    (g.host_key, ls.url_id, ls.kind, ls.start_at or now, ls.due_at, g.min_gap,
                     g.allowance, g.in_flight + i)
                    for g in grants
                    for i, ls in enumerate(g.leases)
                ],
            )  # fmt: skip
        self._xm(
            "UPDATE hosts SET next_allowed_at = ?, budget_used = ?, budget_day = ?, "
            "queued = queued - ?, in_flight = in_flight + ? WHERE "
            f"{'host_id' if by_id else 'host_key'} = ?",
            [
                (g.next_allowed_at, g.budget_used, g.budget_day, len(g.leases), len(g.leases),
                 ids[g.host_key] if by_id else g.host_key)
                for g in grants
            ],
        )  # fmt: skip

    def expired_leases(self, now: float) -> list[tuple[int, str]]:
        return [
            (int(r[0]), r[1])
            for r in self._x(
                # the host key looked up per row found: a join may hash all of hosts first
                f"SELECT url_id, {URL_HOST_KEY} FROM urls INDEXED BY urls_leases "
                "WHERE state = 'leased' AND lease_expires_at <= ?",
                (now,),
            ).fetchall()
        ]

    def requeue_leases(self, url_ids: Sequence[int], now: float) -> int:
        return sum(
            self._moved_by(cur, "leased")
            for cur in self._in(
                self._returning(
                    "UPDATE urls SET state = 'queued', due_at = ?, lease_owner = NULL, "
                    "lease_token = NULL, lease_expires_at = NULL "
                    "WHERE url_id {in} AND state = 'leased' AND lease_expires_at <= ?"
                ),
                url_ids,
                (now,),
                (now,),
            )
        )

    def leased_hosts(self, owner: str) -> list[str]:
        return [
            r[0]
            for r in self._x(
                f"SELECT DISTINCT {URL_HOST_KEY} FROM urls INDEXED BY urls_leases "
                "WHERE state = 'leased' AND lease_owner = ?",
                (owner,),
            ).fetchall()
        ]

    def release_owner(self, owner: str) -> int:
        cur = self._x(
            self._returning(
                "UPDATE urls INDEXED BY urls_leases SET state = 'queued', lease_owner = NULL, "
                "lease_token = NULL, lease_expires_at = NULL "
                "WHERE state = 'leased' AND lease_owner = ?"
            ),
            (owner,),
        )
        return self._moved_by(cur, "leased")

    # -- completion and failure ----------------------------------------------------------------

    def finish(self, completions: Sequence[Completion]) -> list[bool]:
        """The lease fence for the whole batch in one read, then one batched update of the
        live ones (the update keeps the fence in its WHERE too). Atomic: the transaction
        holds the write lock (SQLite) from the read on."""
        live = self.live_leases([c.lease for c in completions])
        done = self._xm(
            FINISH,
            [
                (*done_values(c), c.lease.url_id, c.lease.version, c.lease.token)
                for c, ok in zip(completions, live, strict=True)
                if ok
            ],
        )
        self._check_moved("completed", sum(live), done)
        self._move_states("leased", "done", done)  # as grant(): not counted by the trigger
        out = self._out_of_flight
        for c, ok in zip(completions, live, strict=True):
            if ok:
                out[c.lease.host_key] += 1
        return live

    def lock_and_finish(
        self, keys: Iterable[str], read: Iterable[str], completions: Sequence[Completion]
    ) -> tuple[dict[str, HostRow], list[bool]]:
        return self.lock_hosts(keys, read=read), self.finish(completions)

    def _returning(self, query: str) -> str:
        """``query`` (an UPDATE of urls.state) returning what ``_moved`` counts, on SQLite."""
        return query + " RETURNING host_id, state, due_at" if self._counting else query

    def _moved_by(self, cur: Any, old: str | None) -> int:
        """Count the URLs an UPDATE made with ``_returning`` moved out of state ``old``;
        returns how many it changed."""
        if not self._counting:
            return max(cur.rowcount, 0)
        rows = cur.fetchall()
        self._moved(old, rows)
        return len(rows)

    def _moved(self, old: str | None, rows: Sequence[tuple[int, str, float]]) -> None:
        """URLs (host_id, new state, due_at) went from state ``old``: their hosts' queued and
        in_flight (I6), their hosts' due hint (no later than any queued URL's due time, as
        ``insert_urls`` keeps it) and ``url_states``, once per host and state (SQLite, schema
        8: no row trigger; the rarer moves: fail, expire, release, defer, robots.txt refusals
        and rounds, new rounds, deferred URLs requeued, reparsed failures)."""
        if not self._counting or not rows or old is None:
            return
        per_host: dict[int, list[Any]] = {}
        per_state: Counter[str] = Counter()
        for host_id, new, due in rows:
            if new == old:
                continue
            per_state[new] += 1
            per_state[old] -= 1
            c = per_host.setdefault(host_id, [0, 0, None])
            c[0] += (new == "queued") - (old == "queued")
            c[1] += (new == "leased") - (old == "leased")
            if new == "queued" and (c[2] is None or due < c[2]):
                c[2] = due
        self._xm(
            "UPDATE hosts SET queued = queued + ?, in_flight = in_flight + ?, due_hint = "
            "CASE WHEN ? IS NULL THEN due_hint WHEN queued = 0 THEN ? "
            "ELSE LEAST(COALESCE(due_hint, ?), ?) END WHERE host_id = ?",
            [(q, n, d, d, d, d, h) for h, (q, n, d) in sorted(per_host.items())],
        )
        self._xm(
            "INSERT INTO url_states(state, n) VALUES (?, ?) "
            "ON CONFLICT(state) DO UPDATE SET n = url_states.n + excluded.n",
            sorted((st, n) for st, n in per_state.items() if n),
        )

    @staticmethod
    def _check_moved(what: str, expected: int, changed: int) -> None:
        """The URLs a grant or completion counts into its hosts are the rows it changed: both
        were read in this transaction, under its write lock, with the same fence. A mismatch
        would leave the hosts' counts wrong (I6): the transaction fails instead."""
        if changed != expected:
            raise FrontierError(f"{what} {changed} URLs, expected {expected}: rolled back")

    def _move_states(self, old: str, new: str, n: int) -> None:
        """``n`` URLs went from state ``old`` to ``new`` (``url_states``, SQLite)."""
        if n:
            self._x(
                "UPDATE url_states SET n = n + CASE WHEN state = ? THEN ? ELSE ? END "
                "WHERE state IN (?, ?)",
                (new, n, -n, old, new),
            )

    def live_leases(self, leases: Sequence[Lease]) -> list[bool]:
        live: dict[int, tuple[int, int]] = {}
        ids = sorted({ls.url_id for ls in leases})
        for cur in self._in(
            "SELECT url_id, version, lease_token FROM urls WHERE url_id {in} "
            "AND state = 'leased' ORDER BY url_id FOR UPDATE",
            ids,
        ):
            live.update((int(r[0]), (int(r[1]), int(r[2]))) for r in cur.fetchall())
        return first_live(leases, live)

    def fail_leases(self, rows: Sequence[FailRow]) -> None:
        if not self._counting:
            self._xm(f"UPDATE urls SET {FAIL_SET} WHERE {FENCE}", rows)
            return
        query = self._returning(f"UPDATE urls SET {FAIL_SET} WHERE {FENCE}")
        moved: list[Any] = []
        for r in rows:  # one by one: executemany returns no rows
            moved += self._x(query, r).fetchall()
        self._moved("leased", moved)

    def insert_urls(self, urls: Sequence[NewURL], now: float) -> int:
        """Insert-if-absent, then count the new URLs into their hosts (I6), once per host, and
        into ``url_states``.

        The hosts come first (a URL row holds its host's id), then multi-row inserts. What they
        inserted is known without ``RETURNING`` (which copied every inserted row through a
        temporary table: 35 % of the insert's time for a completion's 2,560 new links): when
        the statements changed as many rows as there are URLs, every URL was new, and counted
        here; otherwise the rows above the largest url_id before the insert are exactly the
        new ones (rowids grow, and the write lock keeps other writers out), counted in one
        range read. PostgreSQL's ``PgStore`` has its own, counted by statement triggers.
        """
        if not urls:
            return 0
        ids = self.host_ids(sorted({u.host_key for u in urls}))
        host_of = [ids[u.host_key] for u in urls]
        # Runs of consecutive URLs alike but for their key and host (a page's links: same
        # state, depth, priority, kind), so that their rows bind 2 values each, not 10.
        runs = [(shape, len(list(g))) for shape, g in groupby(urls, key=_URL_SHAPE)]
        before = self._scalar("SELECT MAX(url_id) FROM urls") or 0
        if len(runs) <= _MAX_RUNS:
            new = self._insert_runs(urls, host_of, runs, now)
        else:
            new = self._insert_rows(urls, host_of, now)
        if new <= 0:
            return 0
        inserted: Counter[tuple[int, str]] = Counter()
        if new == len(urls):
            pos = 0
            for shape, n in runs:
                for h, c in Counter(host_of[pos : pos + n]).items():
                    inserted[(h, shape[0])] += c
                pos += n
        else:
            inserted.update(
                {
                    (int(h), st): int(n)
                    for h, st, n in self._x(
                        "SELECT host_id, state, count(*) FROM urls WHERE url_id > ? "
                        "GROUP BY host_id, state",
                        (before,),
                    ).fetchall()
                }
            )
            if inserted.total() != new:
                raise FrontierError(
                    f"inserted {new} URLs but {inserted.total()} lie above url_id {before}"
                )
        per_host: dict[int, list[Any]] = {}
        per_state: Counter[str] = Counter()
        for (host_id, state), n in inserted.items():
            per_state[state] += n
            counts = per_host.setdefault(host_id, [0, 0])
            if state == "queued":
                counts[0] += n
            elif state == "leased":
                counts[1] += n
        # every new URL is due at ``now``: a host that gets queued URLs has one due by now
        self._xm(
            "UPDATE hosts SET queued = queued + ?, in_flight = in_flight + ?, due_hint = "
            "CASE WHEN ? = 0 THEN due_hint WHEN queued = 0 THEN ? "
            "ELSE LEAST(COALESCE(due_hint, ?), ?) END "
            "WHERE host_id = ?",
            [
                (q, n, q, now, now, now, h)
                for h in sorted(per_host)
                for q, n in [per_host[h]]
                if q or n
            ],
        )
        self._xm(
            "INSERT INTO url_states(state, n) VALUES (?, ?) "
            "ON CONFLICT(state) DO UPDATE SET n = url_states.n + excluded.n",
            sorted(per_state.items()),
        )
        return sum(per_state.values())

    def _insert_runs(
        self,
        urls: Sequence[NewURL],
        host_of: Sequence[int],
        runs: Sequence[tuple[tuple[Any, ...], int]],
        now: float,
    ) -> int:
        """Insert-if-absent run by run, in the batch's order (so url_ids, which break ties in
        the queue's order, come out as one row at a time would give them): a run's shared
        values are bound once per statement and each URL binds its key and host id
        (``INSERT … SELECT`` from ``VALUES``). For a completion's 2,560 links: 3.2 ms
        against 4.8 ms with all ten values bound per row. Returns the rows inserted."""
        keys = [u.url for u in urls]
        step = max(1, (self.dialect.max_params - 8) // 2)
        new = pos = 0
        for (state, reason, priority, depth, kind, hops), n in runs:
            for i in range(pos, pos + n, step):
                j = min(i + step, pos + n)
                pairs: list[Any] = [None] * (2 * (j - i))
                pairs[0::2] = keys[i:j]
                pairs[1::2] = host_of[i:j]
                marks = ",".join(["(?,?)"] * (j - i))
                new += self.cur.execute(
                    "INSERT OR IGNORE INTO urls(url, host_id, state, reason, priority, depth, "
                    "due_at, discovered_at, kind, hops) SELECT column1, column2, "
                    f"?, ?, ?, ?, ?, ?, ?, ? FROM (VALUES {marks})",
                    [state, reason, priority, depth, now, now, kind, hops, *pairs],
                ).rowcount
            pos += n
        return new

    def _insert_rows(self, urls: Sequence[NewURL], host_of: Sequence[int], now: float) -> int:
        """Insert-if-absent with every value bound per row (a batch of many unlike runs).
        The values of all rows in one flat list, sliced per statement: per URL, one extend
        and no per-value generator step (2.8 -> 1.0 ms for a batch's 2,560 links)."""
        params: list[Any] = []
        extend = params.extend
        for u, h in zip(urls, host_of, strict=True):
            extend(url_values(u, h, now))
        width = 10
        step = max(1, self.dialect.max_params // width) * width
        new = 0
        for i in range(0, len(params), step):
            values = params[i : i + step]
            marks = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * (len(values) // width))
            new += self.cur.execute(
                "INSERT OR IGNORE INTO urls(url, host_id, state, reason, priority, depth, "
                f"due_at, discovered_at, kind, hops) VALUES {marks}",
                values,
            ).rowcount
        return new

    def host_ids(self, keys: Sequence[str]) -> dict[str, int]:
        """The ids of the hosts ``keys``, creating the missing rows (with the defaults).

        Read first, then create only the missing ones (a link's host is nearly always known:
        an insert-if-absent of every key cost a write-path probe per host per batch). Hosts
        this transaction read already (a completion's own) are not read again."""
        known = self._host_id
        out = {k: known[k] for k in keys if k in known}
        unread = [k for k in keys if k not in out]
        if unread:
            out.update(self._host_ids(unread))
        missing = [k for k in unread if k not in out]
        if missing:
            self._xm(
                "INSERT INTO hosts(host_key) VALUES (?) ON CONFLICT DO NOTHING",
                [(k,) for k in missing],
            )
            out.update(self._host_ids(missing))
        return out

    def _host_ids(self, keys: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for cur in self._in(
            "SELECT host_key, host_id FROM hosts WHERE host_key {in}", keys, cast="text"
        ):
            out.update((k, int(i)) for k, i in cur.fetchall())
        return out

    def insert_requests(self, rows: Sequence[tuple[str, RequestSpec]]) -> None:
        self._xm(
            "INSERT INTO requests(url_id, method, callback, data, headers, body, render) "
            "SELECT url_id, ?, ?, ?, ?, ?, ? FROM urls WHERE url = ? ON CONFLICT DO NOTHING",
            [
                (r.method, r.callback, r.data, r.headers, r.body, int(r.render), key)
                for key, r in rows
            ],
        )

    def requests_of(self, url_ids: Sequence[int]) -> dict[int, RequestSpec]:
        out: dict[int, RequestSpec] = {}
        # SQLite: a crawl of plain GETs has no request rows; one probe of the empty table
        # instead of binding and probing every lease's id (0.45 M instructions a lease call).
        if self.dialect is SQLITE and self._scalar("SELECT 1 FROM requests LIMIT 1") is None:
            return out
        query = (
            "SELECT url_id, method, callback, data, headers, body, render FROM requests "
            "WHERE url_id {in}"
        )
        for cur in self._in(query, list(url_ids)):
            for url_id, method, callback, data, headers, body, render in cur.fetchall():
                body = None if body is None else bytes(body)
                out[int(url_id)] = RequestSpec(method, callback, data, headers, body, bool(render))
        return out

    def upsert_records(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self._xm(UPSERT_RECORD, rows)

    def set_cookies(self, cookies: Sequence[Cookie], now: float) -> None:
        last = {(c.domain, c.path, c.name): c for c in cookies}  # the last one set wins
        self._xm(
            "INSERT INTO cookies(domain, path, name, value, expires, secure, host_only) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(domain, path, name) DO UPDATE SET "
            "value = excluded.value, expires = excluded.expires, secure = excluded.secure, "
            "host_only = excluded.host_only",
            [
                (c.domain, c.path, c.name, c.value, c.expires, int(c.secure), int(c.host_only))
                for c in last.values()
            ],
        )
        self._x("DELETE FROM cookies WHERE expires <= ?", (now,))

    def cookie_rows(self, now: float) -> list[Cookie]:
        rows = self._x(
            "SELECT domain, path, name, value, expires, secure, host_only FROM cookies "
            "WHERE expires IS NULL OR expires > ? ORDER BY domain, path, name",
            (now,),
        ).fetchall()
        return [Cookie(d, p, n, v, e, bool(s), bool(h)) for d, p, n, v, e, s, h in rows]

    def insert_bodies(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self._xm(
            "INSERT INTO bodies(payload_digest, url_id, url, warc_file, warc_offset, warc_length, "
            "first_seen) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            rows,
        )

    def insert_events(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self._xm(INSERT_EVENT, rows)

    def redirect_target(self, url: str) -> str | None:
        return self._scalar("SELECT redirect_to FROM urls WHERE url = ?", (url,))  # type: ignore[no-any-return]

    def set_last_error(self, rows: Sequence[tuple[str, int]]) -> None:
        self._xm("UPDATE urls SET last_error = ? WHERE url_id = ?", rows)

    def reparse_outcome(self, rows: Sequence[tuple[str | None, int]]) -> None:
        fixed: list[Any] = []
        if self._counting:  # failed URLs parsed without error become done
            for cur in self._in(
                "SELECT host_id, 'done', due_at FROM urls WHERE url_id {in} AND state = 'failed'",
                [u for e, u in rows if e is None],
            ):
                fixed += cur.fetchall()
        self._xm(
            "UPDATE urls SET state = CASE WHEN CAST(? AS TEXT) IS NULL AND state = 'failed' "
            "THEN 'done' ELSE state END, last_error = ?, "
            "reason = CASE WHEN CAST(? AS TEXT) IS NULL THEN NULL ELSE reason END "
            "WHERE url_id = ?",
            [(e, e, e, u) for e, u in rows],
        )
        self._moved("failed", fixed)

    def record_failures(self, rows: Sequence[tuple[int, str, str | None, float]]) -> None:
        self._xm(
            "INSERT INTO failures(url_id, reason, trace, failed_at) "
            "SELECT url_id, CAST(? AS TEXT), CAST(? AS TEXT), ? FROM urls "
            "WHERE url_id = ? AND state = 'failed' "
            "ON CONFLICT(url_id) DO UPDATE SET reason = excluded.reason, "
            "trace = excluded.trace, failed_at = excluded.failed_at",
            [(reason, trace, at, url_id) for url_id, reason, trace, at in rows],
        )

    # -- rounds, deferral ----------------------------------------------------------------------

    def due_rounds(self, now: float, limit: int) -> list[tuple[int, str]]:
        return [
            (int(r[0]), r[1])
            for r in self._x(
                f"SELECT url_id, {URL_HOST_KEY} FROM urls INDEXED BY urls_refetch "
                "WHERE state = 'done' AND next_fetch_at <= ? AND kind <> 'robots' "
                "ORDER BY next_fetch_at LIMIT ?",
                (now, limit),
            ).fetchall()
        ]

    def start_rounds(self, url_ids: Sequence[int]) -> int:
        return sum(
            self._moved_by(cur, "done")
            for cur in self._in(
                self._returning(
                    "UPDATE urls SET state = 'queued', version = version + 1, "
                    "due_at = next_fetch_at, attempts = 0, reason = NULL "
                    "WHERE url_id {in} AND state = 'done'"
                ),
                url_ids,
            )
        )

    def deferred_hosts(self) -> list[str]:
        return [
            r[0]
            for r in self._x(
                "SELECT host_key FROM hosts WHERE robots_failures > 0 "
                "OR robots_state = 'disallow_all' UNION "
                f"SELECT {URL_HOST_KEY} FROM urls INDEXED BY urls_deferred "
                "WHERE state = 'deferred'"
            ).fetchall()
        ]

    def requeue_deferred(self, host_key: str | None = None, reason: str | None = None) -> int:
        if host_key is None:
            cur = self._x(
                self._returning(
                    "UPDATE urls INDEXED BY urls_deferred SET state = 'queued', reason = NULL "
                    "WHERE state = 'deferred'"
                )
            )
        else:
            cur = self._x(
                self._returning(
                    "UPDATE urls INDEXED BY urls_deferred SET state = 'queued', reason = NULL "
                    f"WHERE host_id = {HOST_ID} AND state = 'deferred' AND reason = ?"
                ),
                (host_key, reason),
            )
        return self._moved_by(cur, "deferred")

    def reset_robots_failures(self) -> None:
        self._x(
            "UPDATE hosts SET robots_failures = 0, "
            "robots_expires_at = CASE WHEN robots_state = 'disallow_all' THEN 0 "
            "ELSE robots_expires_at END, "
            "backoff_until = CASE WHEN backoff_reason LIKE 'robots.txt unreachable%' THEN 0 "
            "ELSE backoff_until END, "
            "backoff_reason = CASE WHEN backoff_reason LIKE 'robots.txt unreachable%' THEN NULL "
            "ELSE backoff_reason END "
            "WHERE robots_failures > 0 OR robots_state = 'disallow_all'"
        )

    # -- planner statistics --------------------------------------------------------------------

    def stale_tables(self, min_changes: int, factor: float) -> list[str]:
        """SQLite: none (see ``Store.stale_tables``; its hot statements name their indexes)."""
        return []

    def analyze(self, tables: Sequence[str], timeout: float) -> None:
        return None

    # -- partitions, meta, seeds, cursors ------------------------------------------------------

    def partition(self, partition: int, *, create: bool) -> tuple[str | None, int, float] | None:
        if create:
            self._x(
                "INSERT INTO partitions(partition, owner, epoch, expires_at) "
                "VALUES (?, NULL, 0, 0) ON CONFLICT DO NOTHING",
                (partition,),
            )
        row = self._x(
            "SELECT owner, epoch, expires_at FROM partitions WHERE partition = ?"
            + (" FOR UPDATE" if create else " FOR SHARE"),
            (partition,),
        ).fetchone()
        return None if row is None else (row[0], int(row[1]), float(row[2]))

    def set_partition(self, partition: int, owner: str, epoch: int, expires_at: float) -> None:
        self._x(
            "UPDATE partitions SET owner = ?, epoch = ?, expires_at = ? WHERE partition = ?",
            (owner, epoch, expires_at, partition),
        )

    def renew_partition(self, partition: int, owner: str, epoch: int, expires_at: float) -> bool:
        self._x(
            "UPDATE partitions SET expires_at = ? WHERE partition = ? AND owner = ? AND epoch = ?",
            (expires_at, partition, owner, epoch),
        )
        return self.cur.rowcount == 1

    def set_meta(self, key: str, value: str) -> None:
        self._x(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def add_seeds(self, host_keys: Sequence[str]) -> None:
        self._xm(
            "INSERT INTO seeds(host_key) VALUES (?) ON CONFLICT DO NOTHING",
            [(h,) for h in host_keys],
        )

    def set_cursor(self, consumer: str, cursor: int) -> None:
        self._x(
            "INSERT INTO deliveries(consumer, cursor) VALUES (?, ?) ON CONFLICT(consumer) "
            "DO UPDATE SET cursor = GREATEST(deliveries.cursor, excluded.cursor)",
            (consumer, cursor),
        )

    # -- read side -----------------------------------------------------------------------------

    def progress(self, now: float) -> Progress:
        # One statement, so one snapshot; the partial indexes make the MINs cheap, and the
        # earliest due time is the hosts' hints (schema 6), no index of every queued URL.
        row = self._x(PROGRESS).fetchone()
        queued, leased, next_due, next_exp, host_ready, next_refetch = row
        return Progress(int(queued), int(leased), next_due, next_exp, host_ready, next_refetch)

    def open_hosts(
        self, max_in_flight: int, after: tuple[float, str], limit: int
    ) -> list[tuple[str, float, float]]:
        rows = self._x(
            "SELECT host_key, next_allowed_at, GREATEST(next_allowed_at, backoff_until) "
            "FROM hosts WHERE HAS_WORK AND paused = 0 "
            "AND in_flight < GREATEST(1, COALESCE(max_in_flight, CAST(? AS INTEGER)) "
            ">> LEAST(error_streak, CAST(? AS INTEGER))) "
            "AND (next_allowed_at > ? OR (next_allowed_at = ? AND host_key > ?)) "
            "ORDER BY next_allowed_at, host_key LIMIT ?",
            (max_in_flight, MAX_STREAK_SHIFT, after[0], after[0], after[1], limit),
        ).fetchall()
        return [(r[0], float(r[1]), float(r[2])) for r in rows]

    def earliest_due(self, host_key: str, by: float) -> float | None:
        # The LIMIT 1 probe is what nearly every call needs, and it stops at the first entry
        # of the host's queue index; only a host holding nothing due reads its whole queue.
        if self._scalar(
            f"SELECT 1 FROM urls INDEXED BY urls_queue WHERE host_id = {HOST_ID} "
            "AND state = 'queued' AND due_at <= ? LIMIT 1",
            (host_key, by),
        ):
            return by
        due = self._scalar(
            f"SELECT MIN(due_at) FROM urls INDEXED BY urls_queue WHERE host_id = {HOST_ID} "
            "AND state = 'queued'",
            (host_key,),
        )
        return None if due is None else float(due)

    def _by_state(self) -> dict[str, int]:
        """URLs per state from ``url_states`` (schema 6), kept by the statements and triggers
        that change states: a read of a few rows, not a count of every URL (the reporter asks
        every few seconds)."""
        by_state = dict.fromkeys(STATES, 0)
        by_state.update(
            (r[0], int(r[1]))
            for r in self._x("SELECT state, SUM(n) FROM url_states GROUP BY state").fetchall()
        )
        return by_state

    def stats(self) -> FrontierStats:
        return FrontierStats(
            urls_by_state=self._by_state(),
            hosts=int(self._scalar("SELECT count(*) FROM hosts")),
            records=int(self._scalar("SELECT count(*) FROM records")),
            events=int(self._scalar("SELECT count(*) FROM events")),
            counters={
                r[0]: int(r[1]) for r in self._x("SELECT name, value FROM counters").fetchall()
            },
            meta=dict(self._x("SELECT key, value FROM meta").fetchall()),
        )

    def aggregates(self) -> dict[str, Any]:
        by_state = self._by_state()
        by_status = {
            int(r[0]): int(r[1])
            for r in self._x(
                "SELECT status_code, count(*) FROM urls WHERE status_code IS NOT NULL "
                "GROUP BY status_code ORDER BY status_code"
            ).fetchall()
        }
        fetched, body_bytes = self._x(
            "SELECT count(fetched_at), COALESCE(SUM(body_bytes), 0) FROM urls"
        ).fetchone()
        by_source = {
            r[0]: int(r[1])
            for r in self._x(
                "SELECT source, count(*) FROM records GROUP BY source ORDER BY source"
            ).fetchall()
        }
        return {
            "urls": sum(by_state.values()),
            "urls_by_state": by_state,
            "fetched": int(fetched),
            "status_codes": by_status,
            "body_bytes": int(body_bytes),
            "records": sum(by_source.values()),
            "records_by_source": by_source,
            "events": int(self._scalar("SELECT count(*) FROM events")),
        }

    def report_rows(self) -> list[dict[str, Any]]:
        return self._dicts(
            f"SELECT {cols(REPORT_COLUMNS)} FROM hosts ORDER BY host_key", (), REPORT_COLUMNS
        )

    def audit_facts(self) -> tuple[list[tuple[str, int]], list[float], int]:
        gap_or_slot = self._x(
            "SELECT h.host_key, count(*) FROM (SELECT host_id, granted_at, allowance, "
            "in_flight_before, LAG(granted_at) OVER w AS prev_at, "
            "LAG(min_gap) OVER w AS prev_gap FROM lease_log "
            "WINDOW w AS (PARTITION BY host_id ORDER BY granted_at, id)) AS g "
            "JOIN hosts AS h ON h.host_id = g.host_id "
            "WHERE in_flight_before >= allowance OR granted_at < prev_at + prev_gap - 1e-6 "
            "GROUP BY h.host_key"
        ).fetchall()
        delays = [
            float(r[0])
            for r in self._x(
                "SELECT GREATEST(0, granted_at - eligible_at) FROM lease_log "
                "ORDER BY id DESC LIMIT 100000"
            ).fetchall()
        ]
        grants = int(self._scalar("SELECT count(*) FROM lease_log"))
        return [(r[0], int(r[1])) for r in gap_or_slot], delays, grants

    def delay_histogram(self, bounds: Sequence[float]) -> dict[str, Any]:
        delay = "GREATEST(0, granted_at - eligible_at)"
        cases = "".join(f"count(*) FILTER (WHERE {delay} <= ?), " for _ in bounds)
        row = self._x(
            f"SELECT {cases}count(*), COALESCE(SUM({delay}), 0) FROM lease_log", list(bounds)
        ).fetchone()
        return {"counts": [int(x or 0) for x in row[:-1]], "sum": float(row[-1])}

    def page(self, table: str, after: Any, limit: int) -> list[dict[str, Any]]:
        names, key, _ = STREAMS[table]
        return self._dicts(
            f"SELECT {cols(names)} FROM {table} WHERE {key} > ? ORDER BY {key} LIMIT ?",
            (after, limit),
            names,
        )

    def known_urls(self, after_id: int, limit: int | None) -> list[tuple[int, str]]:
        rows = self._x(
            "SELECT url_id, url FROM urls WHERE url_id > ? ORDER BY url_id LIMIT ?",
            (after_id, _NO_LIMIT if limit is None else limit),
        ).fetchall()
        return [(int(r[0]), r[1]) for r in rows]

    def existing_urls(self, candidates: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for cur in self._in("SELECT url FROM urls WHERE url {in}", list(candidates), cast="text"):
            found.update(r[0] for r in cur.fetchall())
        return found

    def lease_owners(self) -> list[str]:
        rows = self._x(
            "SELECT DISTINCT lease_owner FROM urls INDEXED BY urls_leases WHERE state = 'leased'"
        ).fetchall()
        return [r[0] for r in rows if r[0]]

    def get_meta(self, key: str) -> str | None:
        return self._scalar("SELECT value FROM meta WHERE key = ?", (key,))  # type: ignore[no-any-return]

    def seed_hosts(self) -> frozenset[str]:
        return frozenset(r[0] for r in self._x("SELECT host_key FROM seeds").fetchall())

    def get_cursor(self, consumer: str) -> int:
        value = self._scalar("SELECT cursor FROM deliveries WHERE consumer = ?", (consumer,))
        return 0 if value is None else int(value)

    def records(self) -> list[dict[str, Any]]:
        return self._dicts(
            f"SELECT {cols(RECORD_COLUMNS)} FROM records ORDER BY source, key", (), RECORD_COLUMNS
        )

    def find_bodies(self, digests: Sequence[str]) -> dict[str, tuple[str, int, int, str]]:
        out: dict[str, tuple[str, int, int, str]] = {}
        query = (
            "SELECT payload_digest, warc_file, warc_offset, warc_length, url FROM bodies "
            "WHERE payload_digest {in}"
        )
        for cur in self._in(query, list(digests), cast="text"):
            out.update((d, (f, int(o), int(n), u)) for d, f, o, n, u in cur.fetchall())
        return out

    def body_digests(self, after: str, limit: int | None) -> list[str]:
        return [
            r[0]
            for r in self._x(
                "SELECT payload_digest FROM bodies WHERE payload_digest > ? "
                "ORDER BY payload_digest LIMIT ?",
                (after, _NO_LIMIT if limit is None else limit),
            ).fetchall()
        ]

    def simhashes(self, after_id: int, limit: int | None) -> list[tuple[int, int, int | None]]:
        rows = self._x(
            "SELECT url_id, simhash, near_dup_of FROM urls WHERE url_id > ? "
            "AND simhash IS NOT NULL ORDER BY url_id LIMIT ?",
            (after_id, _NO_LIMIT if limit is None else limit),
        ).fetchall()
        return [(int(u), int(h) & 0xFFFFFFFFFFFFFFFF, n) for u, h, n in rows]

    def reparse_candidates(
        self, where_failed: bool, after_id: int, limit: int
    ) -> list[dict[str, Any]]:
        where = "url_id > ? AND warc_file IS NOT NULL AND kind = 'page' AND " + (
            "state = 'failed' AND last_error LIKE 'parse%'"
            if where_failed
            else "state IN ('done', 'failed')"
        )
        return self._dicts(
            f"SELECT {cols(REPARSE_COLUMNS)} FROM urls WHERE {where} ORDER BY url_id LIMIT ?",
            (after_id, limit),
            REPARSE_COLUMNS,
        )

    def recent_errors(self, limit: int) -> list[dict[str, Any]]:
        return self._dicts(
            f"SELECT {url_cols(ERROR_COLUMNS)} FROM urls WHERE last_error IS NOT NULL "
            "ORDER BY COALESCE(fetched_at, due_at) DESC LIMIT ?",
            (limit,),
            ERROR_COLUMNS,
        )

    def failure_reasons(self, limit: int) -> list[dict[str, Any]]:
        # Reads the failures only (one key probe of urls each), never a scan of every URL.
        return self._dicts(
            "SELECT reason, n, url, trace, failed_at FROM (SELECT f.reason, u.url, f.trace, "
            "f.failed_at, count(*) OVER (PARTITION BY f.reason) AS n, row_number() OVER "
            "(PARTITION BY f.reason ORDER BY f.failed_at, f.url_id) AS r "
            "FROM failures AS f JOIN urls AS u ON u.url_id = f.url_id "
            "WHERE u.state = 'failed') AS g WHERE r = 1 ORDER BY n DESC, reason LIMIT ?",
            (limit,),
            FAILURE_COLUMNS,
        )

    def url_row(self, url: str) -> dict[str, Any] | None:
        rows = self._dicts(
            f"SELECT {url_cols(URL_COLUMNS)} FROM urls WHERE url = ?", (url,), URL_COLUMNS
        )
        return rows[0] if rows else None

    def host_row(self, host_key: str) -> dict[str, Any] | None:
        rows = self._dicts(
            f"SELECT {HOST_COLS} FROM hosts WHERE host_key = ?", (host_key,), HOST_COLUMNS
        )
        return rows[0] if rows else None

    def url_rows(self) -> list[dict[str, Any]]:
        return self._dicts(
            f"SELECT {url_cols(URL_COLUMNS)} FROM urls ORDER BY url_id", (), URL_COLUMNS
        )

    def host_rows(self) -> list[dict[str, Any]]:
        return self._dicts(f"SELECT {HOST_COLS} FROM hosts ORDER BY host_key", (), HOST_COLUMNS)
