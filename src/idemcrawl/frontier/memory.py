"""The in-memory frontier: the same contract over indexed Python structures, in this process.

**Not durable.** Every row lives in this process: a crash, or closing the last handle on it,
loses the crawl. It is for the scheduler simulator and fast tests, which want the real policy
(``scheduler.py``, the same as on SQLite and PostgreSQL) without a file or a server.
``open_frontier("memory:")`` gives a private crawl; ``memory:NAME`` one that every handle opened
with that name in this process shares (threads, like processes on one SQLite file) until the
last of them closes. A transaction is one lock held around the scheduler's function; there is no
rollback, which is safe because the scheduler checks everything that can refuse (fences, control
values) before its first write. Lease tokens and back-off jitter come from ``rng``.

Indexed so that a lease costs about what it grants times log n, not the size of the crawl: per
host, its queued URLs in one heap per priority by (due_at, seq); hosts that may be ready in a
heap by ``next_allowed_at``, hosts waiting for a time (token, back-off, first due URL) in a heap
by that time; leases by expiry, finished URLs by ``next_fetch_at``, queued URLs by ``due_at``.
Every heap is lazy: an entry carries the sequence number its row had when pushed and is dropped
when popped if the row has moved on since (state changed, refiled).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeVar, cast

from ..politeness import allowance
from . import base, store
from .base import DEFERRED, DISALLOWED, DONE, FAILED, LEASED, QUEUED, ROBOTS
from .memory_reads import MemoryReads
from .scheduler import Scheduler, host_ready
from .store import FailRow, Grant, HostRow, PickRow, done_values, first_live

T = TypeVar("T")


class _Url:
    """One ``urls`` row, plus ``seq``: which heap entry of it is current. A column never set
    reads as None (NULL), so a new URL costs only the columns it has."""

    __slots__ = (*store.URL_COLUMNS, "seq")

    def __init__(self, url_id: int, u: base.NewURL, now: float) -> None:
        self.url_id, self.url, self.host_key, self.reason = url_id, u.url, u.host_key, u.reason
        self.version, self.priority, self.depth, self.due_at = 1, u.priority, u.depth, now
        self.discovered_at, self.attempts, self.kind, self.hops = now, 0, u.kind, u.hops
        self.state = None
        self.seq = 0

    def __getattr__(self, name: str) -> None:
        if name in store.URL_COLUMNS:
            return None
        raise AttributeError(name)

    def as_dict(self, columns: Sequence[str] = store.URL_COLUMNS) -> dict[str, Any]:
        return {c: getattr(self, c) for c in columns}


class _Host:
    """One ``hosts`` row, plus its queues and where it is filed in the ready index."""

    __slots__ = (*store.HOST_COLUMNS, "queues", "deferred", "rseq", "wake")

    def __init__(self, host_key: str) -> None:
        for col in store.HOST_COLUMNS:
            setattr(self, col, None)  # hosts are few: set every column
        self.host_key = host_key
        self.next_allowed_at = self.backoff_until = 0.0
        self.in_flight = self.queued = self.error_streak = self.paused = 0
        self.budget_used = self.robots_failures = 0
        #: priority -> heap of (due_at, seq, url_id) of queued URLs.
        self.queues: dict[int, list[tuple[float, int, int]]] = {}
        self.deferred: set[int] = set()
        #: Sequence number of the current ready-index entry, and the time it wakes at (None:
        #: not filed; -inf: in the ready heap).
        self.rseq = 0
        self.wake: float | None = None

    def row(self) -> HostRow:
        return HostRow(*(getattr(self, c) for c in store.HOST_COLUMNS))


class MemoryStore(MemoryReads):
    """All rows of one in-memory crawl and the ``store.Store`` operations on them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handles = 0
        self.urls: list[_Url] = [_Url.__new__(_Url)]  # by url_id (dense; 0: an all-NULL row)
        self.by_url: dict[str, _Url] = {}
        self.hosts: dict[str, _Host] = {}
        self.by_state: Counter[str] = Counter()
        self.seq = itertools.count(1)
        self.ready: list[tuple[float, int, str]] = []  # (next_allowed_at, rseq, host)
        self.parked: list[tuple[float, int, str]] = []  # (wake, rseq, host)
        self.leases: list[tuple[float, int, int]] = []  # (expires_at, seq, url_id)
        self.refetch: list[tuple[float, int, int]] = []  # (next_fetch_at, seq, url_id)
        self.due: list[tuple[float, int, int]] = []  # (due_at, seq, url_id) of queued URLs
        self.record_rows: dict[str, list[Any]] = {}
        self._record_keys: list[str] | None = []
        self.events: list[tuple[Any, ...]] = []
        self.event_keys: set[tuple[int, int]] = set()
        self.bodies: dict[str, tuple[Any, ...]] = {}
        self.requests: dict[int, base.RequestSpec] = {}
        #: url_id -> (reason, trace, failed_at) of URLs that failed for good.
        self.failures: dict[int, tuple[str, str | None, float]] = {}
        self.cookie_jar: dict[tuple[str, str, str], base.Cookie] = {}
        self.lease_log: list[tuple[Any, ...]] = []
        self.counters: Counter[str] = Counter()
        self.meta: dict[str, str] = {}
        self.seeds: set[str] = set()
        self.deliveries: dict[str, int] = {}
        self.partitions: dict[int, tuple[str | None, int, float]] = {}

    # -- the state machine and its indexes (the triggers of the SQL backends) -------------------

    def _host(self, key: str) -> _Host:
        h = self.hosts.get(key)
        if h is None:
            h = self.hosts[key] = _Host(key)
        return h

    def _set_state(self, u: _Url, state: str) -> None:
        """Move a URL to ``state``, keeping its host's counts (I6) and the indexes."""
        old, h = u.state, self.hosts[u.host_key]
        if old == state:
            return
        if old is not None:
            self.by_state[old] -= 1
        if old == QUEUED:
            h.queued -= 1
        elif old == LEASED:
            h.in_flight -= 1
            self._file(h)  # a slot is free again
        elif old == DEFERRED:
            h.deferred.discard(u.url_id)
        u.state = state
        self.by_state[state] += 1
        u.seq = next(self.seq)
        if state == QUEUED:
            h.queued += 1
            entry = (u.due_at, u.seq, u.url_id)
            heapq.heappush(h.queues.setdefault(u.priority, []), entry)
            heapq.heappush(self.due, entry)
            if h.wake is None or h.wake > u.due_at:
                at = max(h.next_allowed_at, h.backoff_until, u.due_at)
                if h.wake is None or h.wake > at:
                    self._file(h, at)
        elif state == LEASED:
            h.in_flight += 1
            heapq.heappush(self.leases, (u.lease_expires_at, u.seq, u.url_id))
        elif state == DONE and u.next_fetch_at is not None:
            heapq.heappush(self.refetch, (u.next_fetch_at, u.seq, u.url_id))
        elif state == DEFERRED:
            h.deferred.add(u.url_id)

    def _file(self, h: _Host, at: float | None = None) -> None:
        """(Re)file a host in the ready index: it may be eligible from ``at`` on."""
        h.rseq += 1
        h.wake = max(h.next_allowed_at, h.backoff_until) if at is None else at
        heapq.heappush(self.parked, (h.wake, h.rseq, h.host_key))

    def _current(self, e: tuple[float, int, int], state: str) -> bool:
        """Is this (key, seq, url_id) heap entry still its URL's, in ``state``?"""
        u = self.urls[e[2]]
        return u.state == state and u.seq == e[1]

    def _live(
        self, heap: list[tuple[float, int, int]], state: str
    ) -> tuple[float, int, int] | None:
        """The first current entry of a heap, dropping stale ones."""
        while heap and not self._current(heap[0], state):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _scan(
        self,
        heap: list[tuple[float, int, int]],
        state: str,
        until: float,
        limit: float,
        want: Callable[[_Url], bool] | None = None,
    ) -> list[_Url]:
        """Up to ``limit`` current entries (that ``want``) with a key up to ``until``, in heap
        order; the heap keeps them (only stale entries are dropped)."""
        out: list[_Url] = []
        taken: list[tuple[float, int, int]] = []
        while len(out) < limit and self._live(heap, state) is not None and heap[0][0] <= until:
            e = heapq.heappop(heap)
            taken.append(e)
            u = self.urls[e[2]]
            if want is None or want(u):
                out.append(u)
        for e in taken:
            heapq.heappush(heap, e)
        return out

    def _min_due(self, h: _Host) -> float:
        tops = (self._live(q, QUEUED) for q in h.queues.values())
        return min((t[0] for t in tops if t is not None), default=math.inf)

    def _leased(self) -> Iterable[_Url]:
        return (self.urls[e[2]] for e in self.leases if self._current(e, LEASED))

    # -- transaction-wide ------------------------------------------------------------------------

    def bump(self, name: str, n: int) -> None:
        if n:
            self.counters[name] += n

    def lock_hosts(
        self, keys: Iterable[str], *, read: Iterable[str] = (), skip_locked: bool = False
    ) -> dict[str, HostRow]:
        return {k: self.hosts[k].row() for k in read if k in self.hosts}

    def ensure_hosts(self, keys: Iterable[str]) -> None:
        for k in keys:
            self._host(k)

    def update_hosts(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if not set(columns) <= set(store.HOST_COLUMNS):
            raise ValueError(f"not host columns: {columns}")
        for row in rows:
            h = self.hosts[row[-1]]
            for col, value in zip(columns, row, strict=False):
                setattr(h, col, value)
            self._file(h)

    # -- leasing -------------------------------------------------------------------------------

    def crawl_paused(self) -> bool:
        return self.meta.get("paused") == "1"

    def first_ready_hosts(self, now: float, max_in_flight: int, limit: int) -> list[HostRow] | None:
        """None: in memory the lease call's steps one by one cost nothing extra."""
        return None

    def ready_hosts(self, now: float, max_in_flight: int, limit: int) -> list[HostRow]:
        while self.parked and self.parked[0][0] <= now:
            _, rseq, key = heapq.heappop(self.parked)
            h = self.hosts[key]
            if h.rseq == rseq:
                h.wake = -math.inf
                heapq.heappush(self.ready, (h.next_allowed_at, rseq, key))
        out: list[HostRow] = []
        keep: list[tuple[float, int, str]] = []
        while self.ready and len(out) < limit:
            entry = heapq.heappop(self.ready)
            h = self.hosts[entry[2]]
            if h.rseq != entry[1]:
                continue
            if not h.queued or h.paused:
                h.wake = None  # a queued URL or a resume files it again
                continue
            configured = h.max_in_flight if h.max_in_flight is not None else max_in_flight
            if h.in_flight >= allowance(configured, h.error_streak):
                # Every slot taken: unfiled until one frees (``_set_state`` files the host
                # again when a lease ends), so busy hosts cost nothing per lease call.
                h.wake = None
                continue
            at = max(h.next_allowed_at, h.backoff_until, self._min_due(h))
            if at > now:
                h.wake = at
                heapq.heappush(self.parked, (at, h.rseq, h.host_key))
                continue
            keep.append(entry)
            if host_ready(cast(HostRow, h), now, max_in_flight):
                out.append(h.row())
        for entry in keep:
            heapq.heappush(self.ready, entry)
        return out

    def pick_urls(
        self, wants: Sequence[tuple[str, int, Sequence[int]]], now: float
    ) -> dict[str, list[PickRow]]:
        out: dict[str, list[PickRow]] = {}
        for host_key, limit, exclude in wants:
            h, skip = self.hosts[host_key], set(exclude)

            def want(u: _Url, skip: set[int] = skip) -> bool:
                return u.kind != ROBOTS and u.url_id not in skip

            urls: list[_Url] = []
            for prio in sorted(h.queues, reverse=True):
                urls += self._scan(h.queues[prio], QUEUED, now, limit - len(urls), want)
                if len(urls) >= limit:
                    break
            out[host_key] = [self.pick_row(u.url_id) for u in urls]
        return out

    def mark_disallowed(self, url_ids: Sequence[int], reason: str) -> None:
        for uid in url_ids:
            self.urls[uid].reason = reason
            self._set_state(self.urls[uid], DISALLOWED)

    def defer_queued(self, host_key: str, reason: str, *, robots_too: bool = False) -> int:
        h, n = self.hosts.get(host_key), 0
        for heap in h.queues.values() if h is not None else ():
            for _, seq, uid in list(heap):
                u = self.urls[uid]
                if u.state == QUEUED and u.seq == seq and (robots_too or u.kind != ROBOTS):
                    u.reason = reason
                    self._set_state(u, DEFERRED)
                    n += 1
            heap[:] = [e for e in heap if self._current(e, QUEUED)]
            heapq.heapify(heap)
        return n

    def claim_url(self, url: str) -> tuple[int, str, str] | None:
        u = self.by_url.get(url)
        return None if u is None else (u.url_id, u.state, u.kind)

    def make_robots(self, url_id: int, now: float, *, new_round: bool) -> None:
        u = self.urls[url_id]
        u.kind = ROBOTS
        if new_round:
            u.version, u.due_at, u.reason = u.version + 1, now, None
            self._set_state(u, QUEUED)

    def pick_row(self, url_id: int) -> PickRow:
        u = self.urls[url_id]
        return tuple(getattr(u, c) for c in store.PICK_COLUMNS)

    def grant(self, grants: Sequence[Grant], owner: str, now: float, expires: float) -> None:
        for g in grants:
            for i, ls in enumerate(g.leases):
                u = self.urls[ls.url_id]
                u.lease_owner, u.lease_token, u.lease_expires_at = owner, ls.token, expires
                u.leased_at = now
                self._set_state(u, LEASED)
                self.lease_log.append(
                    (len(self.lease_log) + 1, g.host_key, ls.url_id, ls.kind,
                     ls.start_at or now, ls.due_at, g.min_gap, g.allowance, g.in_flight + i)
                )  # fmt: skip
            h = self.hosts[g.host_key]
            h.next_allowed_at, h.budget_used, h.budget_day = (
                g.next_allowed_at,
                g.budget_used,
                g.budget_day,
            )
            self._file(h)

    def expired_leases(self, now: float) -> list[tuple[int, str]]:
        return [(u.url_id, u.host_key) for u in self._scan(self.leases, LEASED, now, math.inf)]

    def _requeue(self, u: _Url, due_at: float | None = None) -> None:
        u.lease_owner = u.lease_token = u.lease_expires_at = None
        if due_at is not None:
            u.due_at = due_at
        self._set_state(u, QUEUED)

    def requeue_leases(self, url_ids: Sequence[int], now: float) -> int:
        n = 0
        for uid in url_ids:
            u = self.urls[uid]
            if u.state == LEASED and u.lease_expires_at <= now:
                self._requeue(u, now)
                n += 1
        return n

    def leased_hosts(self, owner: str) -> list[str]:
        return sorted({u.host_key for u in self._leased() if u.lease_owner == owner})

    def release_owner(self, owner: str) -> int:
        mine = [u for u in self._leased() if u.lease_owner == owner]
        for u in mine:
            self._requeue(u)
        return len(mine)

    # -- completion and failure ----------------------------------------------------------------

    def _url(self, url_id: int) -> _Url:
        return self.urls[url_id] if 0 < url_id < len(self.urls) else self.urls[0]

    def _fenced(self, url_id: int, version: int, token: int) -> _Url | None:
        u = self._url(url_id)
        ok = u.state == LEASED and u.version == version and u.lease_token == token
        return u if ok else None

    def lock_and_finish(
        self, keys: Iterable[str], read: Iterable[str], completions: Sequence[base.Completion]
    ) -> tuple[dict[str, HostRow], list[bool]]:
        return self.lock_hosts(keys, read=read), self.finish(completions)

    def finish(self, completions: Sequence[base.Completion]) -> list[bool]:
        out = []
        for c in completions:
            u = self._fenced(c.lease.url_id, c.lease.version, c.lease.token)
            out.append(u is not None)
            if u is None:
                continue
            for (col, keep), value in zip(store.DONE_COLUMNS, done_values(c), strict=True):
                if value is not None or not keep:
                    setattr(u, col, value)
            u.attempts, u.lease_owner, u.lease_token, u.lease_expires_at = 0, None, None, None
            self._set_state(u, DONE)
        return out

    def live_leases(self, leases: Sequence[base.Lease]) -> list[bool]:
        urls = (self._url(ls.url_id) for ls in leases)
        live = {u.url_id: (u.version, u.lease_token) for u in urls if u.state == LEASED}
        return first_live(leases, live)

    def fail_leases(self, rows: Sequence[FailRow]) -> None:
        for row in rows:
            u = self._fenced(*row[-3:])
            if u is None:
                continue
            state, u.due_at, u.last_error, u.reason = row[:4]
            for col, value in zip(store.FAIL_COLUMNS[4:], row[4:9], strict=True):
                if value is not None:
                    setattr(u, col, value)
            u.attempts += 1
            u.lease_owner = u.lease_token = u.lease_expires_at = None
            self._set_state(u, state)

    def insert_urls(self, urls: Sequence[base.NewURL], now: float) -> int:
        n = 0
        for new in urls:
            if new.url in self.by_url:
                continue
            u = _Url(len(self.urls), new, now)
            self.urls.append(u)
            self.by_url[new.url] = u
            self._host(new.host_key)
            self._set_state(u, new.state)
            n += 1
        return n

    def insert_requests(self, rows: Sequence[tuple[str, base.RequestSpec]]) -> None:
        for key, spec in rows:
            u = self.by_url.get(key)
            if u is not None:
                self.requests.setdefault(u.url_id, spec)

    def requests_of(self, url_ids: Sequence[int]) -> dict[int, base.RequestSpec]:
        return {i: self.requests[i] for i in url_ids if i in self.requests}

    def set_cookies(self, cookies: Sequence[base.Cookie], now: float) -> None:
        for c in cookies:
            self.cookie_jar[(c.domain, c.path, c.name)] = c
        for k, c in list(self.cookie_jar.items()):
            if c.expires is not None and c.expires <= now:
                del self.cookie_jar[k]

    def cookie_rows(self, now: float) -> list[base.Cookie]:
        return [
            c
            for _, c in sorted(self.cookie_jar.items())
            if c.expires is None or c.expires > now
        ]

    def upsert_records(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for rid, source, key, url, data, chash, now, _ in rows:
            rec = self.record_rows.get(rid)
            if rec is None:
                self.record_rows[rid] = [rid, source, key, url, data, chash, now, now]
                self._record_keys = None
            elif rec[5] != chash:
                rec[3], rec[4], rec[5], rec[7] = url, data, chash, now

    def insert_bodies(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for row in rows:
            self.bodies.setdefault(row[0], row)

    def insert_events(self, rows: Sequence[tuple[Any, ...]]) -> None:
        for row in rows:
            if (row[0], row[1]) not in self.event_keys:
                self.event_keys.add((row[0], row[1]))
                self.events.append((len(self.events) + 1, *row))

    def redirect_target(self, url: str) -> str | None:
        u = self.by_url.get(url)
        return None if u is None else u.redirect_to

    def set_last_error(self, rows: Sequence[tuple[str, int]]) -> None:
        for message, uid in rows:
            self.urls[uid].last_error = message

    def reparse_outcome(self, rows: Sequence[tuple[str | None, int]]) -> None:
        for error, uid in rows:
            u = self._url(uid)
            u.last_error = error
            if error is None:
                u.reason = None
                if u.state == FAILED:
                    self._set_state(u, DONE)

    def record_failures(self, rows: Sequence[tuple[int, str, str | None, float]]) -> None:
        for url_id, reason, trace, at in rows:
            if self._url(url_id).state == FAILED:
                self.failures[url_id] = (reason, trace, at)

    # -- rounds, deferral ----------------------------------------------------------------------

    def due_rounds(self, now: float, limit: int) -> list[tuple[int, str]]:
        due = self._scan(self.refetch, DONE, now, limit, lambda u: u.kind != ROBOTS)
        return [(u.url_id, u.host_key) for u in due]

    def start_rounds(self, url_ids: Sequence[int]) -> int:
        n = 0
        for uid in url_ids:
            u = self.urls[uid]
            if u.state == DONE:
                u.version, u.due_at, u.attempts, u.reason = u.version + 1, u.next_fetch_at, 0, None
                self._set_state(u, QUEUED)
                n += 1
        return n

    def deferred_hosts(self) -> list[str]:
        return sorted(k for k, h in self.hosts.items() if h.deferred or h.robots_failures > 0)

    def requeue_deferred(self, host_key: str | None = None, reason: str | None = None) -> int:
        hosts = self.hosts.values() if host_key is None else [self.hosts[host_key]]
        n = 0
        for h in list(hosts):
            for uid in sorted(h.deferred):
                u = self.urls[uid]
                if reason is None or u.reason == reason:
                    u.reason = None
                    self._set_state(u, QUEUED)
                    n += 1
        return n

    def reset_robots_failures(self) -> None:
        for h in self.hosts.values():
            if not h.robots_failures and h.robots_state != "disallow_all":
                continue
            h.robots_failures = 0
            if h.robots_state == "disallow_all":
                h.robots_expires_at = 0.0
            if (h.backoff_reason or "").startswith("robots.txt unreachable"):
                h.backoff_until, h.backoff_reason = 0.0, None
            self._file(h)

    # -- partitions, meta, seeds, cursors ------------------------------------------------------

    def partition(self, partition: int, *, create: bool) -> tuple[str | None, int, float] | None:
        if create:
            self.partitions.setdefault(partition, (None, 0, 0.0))
        return self.partitions.get(partition)

    def set_partition(self, partition: int, owner: str, epoch: int, expires_at: float) -> None:
        self.partitions[partition] = (owner, epoch, expires_at)

    def renew_partition(self, partition: int, owner: str, epoch: int, expires_at: float) -> bool:
        if self.partitions.get(partition, (None, -1, 0.0))[:2] != (owner, epoch):
            return False
        self.partitions[partition] = (owner, epoch, expires_at)
        return True

    def set_meta(self, key: str, value: str) -> None:
        self.meta[key] = value

    def add_seeds(self, host_keys: Sequence[str]) -> None:
        self.seeds.update(host_keys)

    def set_cursor(self, consumer: str, cursor: int) -> None:
        self.deliveries[consumer] = max(self.deliveries.get(consumer, cursor), cursor)

    def stale_tables(self, min_changes: int, factor: float) -> list[str]:
        return []  # indexed Python structures: no planner

    def analyze(self, tables: Sequence[str], timeout: float) -> None:
        return None


class MemoryFrontier(Scheduler):
    """The frontier contract in this process's memory (see the module doc: not durable)."""

    PREFIX: ClassVar[str] = "memory:"
    _named: ClassVar[dict[str, MemoryStore]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self, name: str | None = None, *, create: bool = True, rng: random.Random | None = None
    ) -> None:
        with self._named_lock:
            crawl = None if name is None else self._named.get(name)
            if crawl is None and name is not None and not create:
                raise base.FrontierError(f"no in-memory crawl {name!r} in this process")
            if crawl is None:
                crawl = (
                    MemoryStore() if name is None else self._named.setdefault(name, MemoryStore())
                )
            crawl.handles += 1
        self.name, self._store, self._closed = name, crawl, False
        self._rng = rng if rng is not None else random.Random()

    def migrate(self) -> int:
        return store.SCHEMA_VERSION

    def _run(
        self,
        fn: Callable[[Any], T],
        *,
        write: bool = True,
        snapshot: bool = False,
        retry: bool = True,
    ) -> T:
        if self._closed:
            raise base.FrontierError("the in-memory frontier is closed")
        with self._store.lock:
            return fn(self._store)

    def close(self) -> None:
        with self._named_lock:
            if self._closed:
                return
            self._closed = True
            self._store.handles -= 1
            if self.name is not None and self._store.handles == 0:
                self._named.pop(self.name, None)
