"""The frontier's policy, written once: every backend runs it over its own store.

:class:`Scheduler` implements the whole contract of ``base.py``. Each backend subclasses it and
supplies the transaction (``_run``: connection, BEGIN/COMMIT, retries) and a :class:`Store` per
transaction (its rows and SQL dialect); the decisions are all made here, in Python:

* **lease** — expire stale leases, then (unless the crawl is paused) level 1: ready hosts
  (tokens, allowance by error streak, back-off, paused, something due: :func:`host_ready`);
  level 2 per ready host: robots.txt first while unknown or expired, the defer rules
  (Crawl-delay above the cap, robots.txt unreachable after N attempts, daily budget), then
  delay, allowance and budget decide how many URLs to take; the URLs of all those hosts are
  picked in one store call, robots-disallowed ones become ``disallowed``; finally one grant for
  every host (lease rows, lease log, host token and budget).
* **complete** / **fail** — the lease fence (I3), then the host: a robots.txt answer becomes
  host state (sitemaps, defer, back-off), a success steps the error streak down and feeds the
  latency average, an error backs the host off (circuit breaker), and every end of a request
  spaces the next start (I8); records, links, bodies, redirect loops, events and counters.
* rounds (``reschedule_due``), ``requeue_deferred``, live ``control`` and partition fences.
* **planner statistics** — a store whose engine plans from statistics (PostgreSQL) is asked now
  and then, between transactions, which of its tables changed several-fold since their last
  ANALYZE, and analyzes those (:meth:`Scheduler._keep_statistics`).

The formulas themselves live in ``politeness.py`` and ``robots.py``. Host state a batch changes
is computed here from rows the store read (and, on PostgreSQL, locked) in the same transaction,
and written back once per host.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import robots
from .. import url as urlmod
from ..politeness import allowance, backoff_seconds, effective_delay, update_latency
from ..robots import RobotsState, needs_fetch, state_from_row, state_to_row
from ..robots import outcome as robots_outcome
from .base import (
    DOWNLOAD,
    FAILED,
    LEASED,
    PAGE,
    QUEUED,
    ROBOTS,
    SITEMAP,
    Completion,
    Failure,
    Fence,
    FrontierError,
    HostPolicy,
    Lease,
    NewURL,
    PartitionBusy,
    Reparsed,
    RequestSpec,
    StaleEpoch,
    control_value,
    request_url,
)
from .reads import Reads
from .store import (
    FailRow,
    Grant,
    HostRow,
    PickRow,
    Store,
    event_values,
)

#: Host columns a completion or failure may change (written once per host per batch).
AFTER_REQUEST_COLUMNS = (
    "latency_ewma", "error_streak", "backoff_until", "backoff_reason", "next_allowed_at",
)  # fmt: skip
#: Host columns a robots.txt answer sets (``robots.state_to_row`` plus the failure count).
ROBOTS_COLUMNS = (
    "robots_state", "robots_body", "robots_fetched_at", "robots_expires_at", "crawl_delay",
    "robots_meta", "robots_failures",
)  # fmt: skip
#: Level 2 asks for this many URLs beyond what it needs when robots.txt may refuse some, once
#: some were refused; the first round asks for at most twice what it needs (most hosts refuse
#: nothing, and the spare rows were read and robots-checked for nothing: 3.5 checks per grant).
ROBOTS_SLACK = 16

BLOCKED = "blocked by operator"

#: Level 1 (``Scheduler._ready_hosts``): a lease call of ``limit`` reads ``limit`` +
#: READY_SLACK ready hosts first (fewer when the hosts of the last lease call took several
#: URLs each: ``Scheduler._first_window``), and at most READY_REACH x ``limit`` + READY_SLACK
#: in all.
READY_SLACK = 8
READY_REACH = 2

#: Planner statistics (``Scheduler._keep_statistics``). A table is re-analyzed once the rows
#: changed since its last ANALYZE (by any process: the server's counters) reach STALE_FACTOR
#: times its size then, and at least STALE_MIN_CHANGES: a table that grows fivefold, or is
#: rewritten four times over. Rarely (an ANALYZE of urls reads a 30,000-row sample: 130 ms at
#: 10^5 URLs), yet statistics never describe a table more than five times smaller than it is
#: (level 1 on default statistics at 10^5 URLs: 72-146 ms a lease call; analyzed, 5-13 ms).
STALE_MIN_CHANGES = 1_000
STALE_FACTOR = 4.0
#: The check (one read of the server's counters) runs before a lease call and after an ``add``
#: at most every STATS_CHECK_SECONDS, or sooner once this process has offered STATS_CHECK_URLS
#: URLs since the last one (a bulk seed is analyzed as it ends: the first lease after it
#: already plans on statistics).
STATS_CHECK_SECONDS = 60.0
STATS_CHECK_URLS = 50_000
#: An ANALYZE running longer than this is cancelled; after a failed check or ANALYZE the next
#: try waits STATS_RETRY_SECONDS.
ANALYZE_TIMEOUT = 120.0
STATS_RETRY_SECONDS = 600.0

log = logging.getLogger(__name__)


# -- policy helpers ------------------------------------------------------------------------------


def host_ready(h: HostRow, now: float, max_in_flight: int) -> bool:
    """Level 1 (R6-R8): may ``h`` be granted a lease at ``now``, its queue aside?

    ``Store.ready_hosts`` selects with this predicate plus "some queued URL is due" (so that a
    host holding only future retries cannot sit at the head of the window and starve ready
    hosts behind it): ``sql_dialect.READY_HOSTS`` is it in SQL, index-friendly; the memory
    store calls it.
    """
    configured = h.max_in_flight if h.max_in_flight is not None else max_in_flight
    return (
        h.queued > 0
        and h.next_allowed_at <= now
        and h.backoff_until <= now
        and not h.paused
        and h.in_flight < allowance(configured, h.error_streak)
    )


def defer_reason(state: RobotsState, failures: int, policy: HostPolicy) -> str | None:
    """Why a host's pages cannot be crawled in this run at all, if they cannot."""
    if state.deferred_reason:
        return state.deferred_reason
    if state.mode == robots.DISALLOW_ALL and failures >= policy.robots_max_attempts:
        return f"robots.txt unreachable after {failures} attempts: {state.last_error}"
    return None


def budget_day(now: float) -> str:
    """The UTC day a per-host fetch budget counts against (R17)."""
    return time.strftime("%Y-%m-%d", time.gmtime(now))


def budget_left(h: HostRow, day: str, policy: HostPolicy) -> float:
    """Fetches the host may still start on ``day`` (inf without a budget)."""
    budget = h.budget if h.budget is not None else policy.daily_budget
    if budget is None:
        return math.inf
    used = h.budget_used if h.budget_day == day else 0
    return max(0, budget - used)


def end_gap(h: dict[str, Any], policy: HostPolicy) -> float:
    """I8: the delay (configured, or robots Crawl-delay within the cap) that also separates the
    end of one response from the next start on the host."""
    cap = policy.robots.settings.crawl_delay_cap if policy.robots is not None else -1.0
    configured = h["delay"] if h["delay"] is not None else policy.delay
    crawl_delay = h["crawl_delay"]
    return max(configured, crawl_delay if crawl_delay is not None and crawl_delay <= cap else 0.0)


def sitemap_urls(locations: Iterable[str], host_key: str) -> list[NewURL]:
    """robots.txt ``Sitemap:`` lines that become sitemap URLs of the crawl (R12).

    Only sitemaps on the robots.txt's own host are taken: a sitemap elsewhere would be fetched
    outside the crawl's scope, and its entries could not be vouched for by this host anyway.
    """
    out = []
    for loc in locations:
        try:
            u = urlmod.normalise(loc)
        except urlmod.InvalidURL:
            continue
        if urlmod.host_key(u) == host_key:
            out.append(NewURL(u, host_key, priority=5, depth=1, kind=SITEMAP))
    return out


class _LeaseSlots:
    """A :class:`~.base.Lease` under construction: the same slots, no frozen ``__setattr__``.

    A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__``, a
    call per field: 2.1 us per Lease of 19 fields, 0.5 ms of every lease call of 256 (about
    a sixth of its Python). Plain stores into these slots, then the instance's class set to
    ``Lease`` (allowed: the two layouts are the same slots in the same order), make the same
    frozen, hashable, equal ``Lease`` in a third of the time.
    """

    __slots__ = Lease.__slots__


if _LeaseSlots.__slots__ != Lease.__slots__ or hasattr(Lease, "__weakref__"):
    raise ImportError("Lease's slots changed: _LeaseSlots must have the same layout")


def lease_from_row(
    row: PickRow,
    host_key: str,
    token: int,
    owner: str,
    expires: float,
    kind: str,
    start_at: float = 0.0,
    paced: bool = False,
) -> Lease:
    """The lease of one picked row (``store.PICK_COLUMNS``), built as ``_LeaseSlots`` says."""
    ls: Any = _LeaseSlots()
    ls.url_id, ls.url, ls.version, ls.depth, ls.attempts, ls.due_at, row_kind = row[:7]
    ls.etag, ls.last_modified, ls.prev_hash, ls.prev_status, ls.interval, hops = row[7:13]
    ls.host_key = host_key
    ls.token = token
    ls.owner = owner
    ls.expires_at = expires
    ls.kind = kind if kind == ROBOTS else row_kind
    ls.hops = hops or 0
    ls.start_at = start_at
    ls.request = None
    ls.paced = paced
    ls.__class__ = Lease
    return ls  # type: ignore[no-any-return]


def insert_urls(s: Store, urls: Sequence[NewURL], now: float) -> int:
    """Insert-if-absent (I1) and, for the URLs that are new, their request specs in the same
    transaction (I11). The first occurrence of a key decides: a key known before, or first
    seen in this batch without a spec, gets none. Returns how many URLs were new."""
    specs: dict[str, RequestSpec] = {}
    # Nearly every URL is a plain GET with no spec: one pass tests that, and only a batch
    # holding a spec walks its URLs in Python (per link, 0.1 us instead of a dict update).
    if any([u.request is not None for u in urls]):
        first: dict[str, RequestSpec | None] = {}
        for u in urls:
            first.setdefault(u.url, u.request)
        specs = {k: r for k, r in first.items() if r is not None}
    # Every writer has locked the hosts of the URLs it inserts (lock_hosts), so no other
    # transaction can insert one of these keys between this read and the insert.
    known = s.existing_urls(list(specs)) if specs else set()
    n = s.insert_urls(urls, now)
    fresh = [(k, r) for k, r in specs.items() if k not in known]
    if fresh:
        s.insert_requests(fresh)
    return n


def with_requests(s: Store, leases: list[Lease]) -> list[Lease]:
    """The leases with their stored request specs (I11): one batched read, robots.txt aside."""
    ids = [ls.url_id for ls in leases if ls.kind != ROBOTS]
    specs = s.requests_of(ids) if ids else {}
    if not specs:
        return leases
    return [
        dataclasses.replace(ls, request=specs[ls.url_id]) if ls.url_id in specs else ls
        for ls in leases
    ]


def status_class(status: int | None) -> str | None:
    """The response class a metric counts (R24): 2xx, 3xx, 304, 4xx, 429, 5xx."""
    if status is None or status <= 0:
        return None
    if status in (304, 429):
        return str(status)
    return f"{min(max(status // 100, 1), 5)}xx"


def redirect_loop(
    url: str, target: str | None, target_of: Callable[[str], str | None], limit: int = 32
) -> bool:
    """Does following the stored ``redirect_to`` chain from ``target`` lead back into a cycle?

    Dedup alone already stops a loop from being fetched twice; this tells the operator why the
    chain ended (R14). A chain longer than ``limit`` counts as a loop too.
    """
    seen = {url}
    for _ in range(limit):
        if target is None:
            return False
        if target in seen:
            return True
        seen.add(target)
        target = target_of(target)
    return True


def completion_counters(pages: Sequence[Completion]) -> dict[str, int]:
    """Counters an accepted batch of page completions adds (status classes, bytes, dedup)."""
    out: dict[str, int] = {}

    def bump(name: str, n: int = 1) -> None:
        if n:
            out[name] = out.get(name, 0) + n

    for c in pages:
        cls = status_class(c.status)
        if cls:
            bump(f"status_{cls}")
        bump("bytes_fetched", c.body_bytes or 0)
        if c.payload_digest and not c.stored_body and c.status != 304 and c.warc_file:
            bump("content_duplicates")
        if c.near_dup_of is not None:
            bump("near_duplicates")
        if c.changed and c.lease.kind == PAGE and c.lease.version > 1:
            bump("pages_changed")
        for name, n in c.counters.items():
            bump(name, n)
        for reason, n in c.rejections.items():
            bump(f"links_rejected_{reason}", n)
    return out


#: How far ahead one grant may promise request starts on a host spaced only by the adaptive gap
#: (I6): a fast host then gets a lease call's worth of grants at once instead of one lease
#: transaction per request (a 10 ms host at 8 in flight: a 2.5 ms gap).
SCHEDULE_AHEAD = 0.05


@dataclass(slots=True)
class _Plan:
    """What level 2 decided for one host before its URLs are picked."""

    host: HostRow
    take: int
    state: RobotsState | None
    delay: float
    allow: int
    #: robots.txt may refuse some of the host's URLs: pick spare rows and check each. False
    #: for a file that refuses nothing (``RobotsCache.allows_every_url``), most of them.
    check: bool = False
    rows: list[PickRow] = field(default_factory=list)


# -- the contract, once ------------------------------------------------------------------------


class Scheduler(Reads):
    """The frontier contract over a :class:`Store`; a backend supplies ``_run`` (see
    :class:`~.reads.Reads`), ``migrate`` and ``close``.

    ``_rng`` draws lease tokens and back-off jitter: pass ``rng=random.Random(seed)`` to a
    backend's constructor for a reproducible run (the simulator, property tests).
    """

    _rng: random.Random
    #: When (``time.monotonic``) the statistics are checked next, the URLs this process offered
    #: for insertion since the last check, and (after a failure) when they may be tried again.
    _stats_due_at: float = -math.inf
    _stats_offered: int = 0
    _stats_retry_at: float = -math.inf
    #: Page URLs per host the last lease call that granted pages granted (``_first_window``).
    _per_host: float = 1.0

    # -- planner statistics --------------------------------------------------------------------

    def _offered(self, n: int) -> None:
        self._stats_offered += n

    def _keep_statistics(self) -> list[str]:
        """ANALYZE the tables the server counts as changed several-fold since their last
        analyze (manual or auto); returns them.

        Nothing else does it on a server running with ``autovacuum = off``, or whose autovacuum
        lags a bulk seed, and then level 1 is planned on default statistics (72-146 ms a lease
        call at 10^5 URLs instead of 5-13 ms). The decision reads the server's counters, so it is
        right for a fleet of processes sharing the crawl; each runs it between its own
        transactions, never inside a lease's, and a failure (the ANALYZE cancelled by its
        timeout, the connection lost) is logged and tried again later: it never fails a call.
        """
        now = time.monotonic()
        if now < self._stats_retry_at or (
            now < self._stats_due_at and self._stats_offered < STATS_CHECK_URLS
        ):
            return []
        self._stats_offered = 0
        self._stats_due_at = now + STATS_CHECK_SECONDS
        try:
            tables = self._run(
                lambda s: s.stale_tables(STALE_MIN_CHANGES, STALE_FACTOR), write=False, retry=False
            )
            if tables:
                started = time.monotonic()
                self._run(lambda s: s.analyze(tables, ANALYZE_TIMEOUT), write=False, retry=False)
                log.info("analyzed %s in %.2f s", ", ".join(tables), time.monotonic() - started)
            return tables
        except FrontierError as exc:  # a closed frontier fails the lease call itself next
            self._stats_retry_at = time.monotonic() + STATS_RETRY_SECONDS
            log.warning(
                "keeping the frontier's planner statistics failed; trying again in %.0f s: %s",
                STATS_RETRY_SECONDS,
                exc,
            )
            return []

    # -- scheduling core -----------------------------------------------------------------------

    def add(self, urls: Iterable[NewURL], now: float) -> int:
        batch = list(urls)
        if not batch:
            return 0

        def tx(s: Store) -> int:
            # Lock first, like every writer: a completion inserting the same link cannot wait
            # on us while we wait on its host row.
            s.lock_hosts({u.host_key for u in batch})
            return insert_urls(s, batch, now)

        n = self._run(tx)
        self._offered(len(batch))
        self._keep_statistics()
        return n

    def lease(
        self,
        owner: str,
        limit: int,
        now: float,
        lease_seconds: float,
        policy: HostPolicy,
        fence: Fence | None = None,
        paced: int | None = None,
    ) -> list[Lease]:
        if limit <= 0:
            return []
        self._keep_statistics()
        return self._run(
            lambda s: self._lease(s, owner, limit, now, now + lease_seconds, policy, fence, paced)
        )

    def _lease(
        self,
        s: Store,
        owner: str,
        limit: int,
        now: float,
        expires: float,
        policy: HostPolicy,
        fence: Fence | None,
        paced_limit: int | None = None,
    ) -> list[Lease]:
        if fence is not None:
            self._check_fence(s, fence, owner, now)
        paced = limit if paced_limit is None else max(0, paced_limit)
        # Level 1's first window with the checks before it, where the store reads them in one
        # statement (PostgreSQL); else, or when a lease expired or the crawl is paused, the
        # steps one by one: expire, the pause flag, then level 1.
        window = self._first_window(limit)
        first = s.first_ready_hosts(now, policy.max_in_flight, window)
        if first is None:
            self._expire(s, now, in_lease=True)
            if s.crawl_paused():
                return []  # the operator paused the whole crawl (idemcrawl control pause)
        grants: list[Grant] = []
        granted = 0
        day = budget_day(now)
        ready = self._ready_hosts(s, now, policy, limit, window, first)
        while granted < limit:
            # Plan hosts until their shares cover what is left, then pick for all at once.
            plans: list[_Plan] = []
            room = limit - granted
            for h in ready:
                plan = self._plan_host(s, h, owner, room, paced, now, day, expires, policy)
                if isinstance(plan, Grant):  # its robots.txt
                    grants.append(plan)
                    granted += 1
                    room -= 1
                    paced -= plan.leases[0].paced
                elif plan is not None:
                    plans.append(plan)
                    room -= plan.take
                    paced -= plan.take if plan.delay > 0 else 0
                if room <= 0:
                    break
            if not plans:
                break
            self._pick(s, plans, now, policy)
            for p in plans:
                g = self._grant_of(p.host, p.rows, PAGE, owner, now, day, expires, p.delay, p.allow)
                if g is not None:
                    grants.append(g)
                    granted += len(g.leases)
        # Request specs are read before the grant, which is then the call's last statement
        # (PostgreSQL sends it with COMMIT); bumped before it: the store may write the
        # counters with it (PostgreSQL).
        leases = with_requests(s, [ls for g in grants for ls in g.leases])
        s.bump("leases_granted", granted)
        if grants:
            s.grant(grants, owner, now, expires)
            pages = [len(g.leases) for g in grants if g.leases[0].kind != ROBOTS]
            if pages:
                self._per_host = sum(pages) / len(pages)
        return leases

    def _first_window(self, limit: int) -> int:
        """How many ready hosts level 1 reads first for a call of ``limit``: as many as the
        call needs at the URLs per host the last call granted, plus READY_SLACK; at most
        ``limit`` + READY_SLACK (one URL per host). Each host read is locked (PostgreSQL: a
        row lock, WAL) and sent back whole: ``bench crawl`` on PostgreSQL read 29-31 hosts
        for the 3-4 it granted (8 URLs each at 8 in flight per host, session 9). A call whose
        hosts take fewer than the last call's reads the second window (``_ready_hosts``),
        whose reach is the same, so the hosts granted are those one larger window gives."""
        return math.ceil(limit / max(self._per_host, 1.0)) + READY_SLACK

    @staticmethod
    def _ready_hosts(
        s: Store,
        now: float,
        policy: HostPolicy,
        limit: int,
        first: int,
        first_rows: list[HostRow] | None = None,
    ) -> Iterator[HostRow]:
        """Level 1 for a lease call of ``limit``, read in two windows: first ``first`` hosts
        (``_first_window``: ``limit`` plus READY_SLACK when hosts take a lease each, which
        then covers the call whenever the ready hosts take a lease each);
        only a call that planned them all with room left (hosts that took nothing: deferred,
        robots.txt unreachable, budget spent) reads the second, as far as READY_REACH x
        ``limit`` + READY_SLACK hosts, skipping those already seen. One read of the whole
        reach made PostgreSQL walk, test and lock 520 hosts for a call of 256 on hosts taking
        one lease each (server CPU per lease call at 10^6 URLs: 23.4 ms, 21.6 in windows).
        ``first_rows``: the first window, when ``Store.first_ready_hosts`` already read it."""
        rows = (
            first_rows
            if first_rows is not None
            else s.ready_hosts(now, policy.max_in_flight, first)
        )
        yield from rows
        if len(rows) < first:
            return  # every ready host was in the first window
        seen = {h.host_key for h in rows}
        for h in s.ready_hosts(now, policy.max_in_flight, READY_REACH * limit + READY_SLACK):
            if h.host_key not in seen:
                yield h

    def _plan_host(
        self,
        s: Store,
        h: HostRow,
        owner: str,
        room: int,
        paced: int,
        now: float,
        day: str,
        expires: float,
        policy: HostPolicy,
    ) -> _Plan | Grant | None:
        """Level 2 for one ready host: its robots.txt first (granted at once), else how many
        of its URLs to take, if any. ``paced``: how many more leases of hosts spaced by a gap
        the call may grant (``lease(paced=...)``); a host that needs one beyond them is left
        as it is, ready for the next call."""
        configured = h.delay if h.delay is not None else policy.delay
        max_in_flight = h.max_in_flight if h.max_in_flight is not None else policy.max_in_flight
        state: RobotsState | None = None
        cap = math.inf
        if policy.robots is not None:
            cap = policy.robots.settings.crawl_delay_cap
            state = state_from_row(h._asdict())
            if needs_fetch(state, now):
                if configured > 0 and paced <= 0:
                    return None
                return self._lease_robots(s, h, owner, now, day, expires, configured, policy)
            assert state is not None
            reason = defer_reason(state, h.robots_failures, policy)
            if reason is not None:
                self._defer_host(s, h.host_key, reason)
                return None
            if state.mode == robots.DISALLOW_ALL:
                return None  # unreachable robots.txt: wait for its retry (host backs off until)
        allow = allowance(max_in_flight, h.error_streak)
        crawl_delay = state.crawl_delay if state else h.crawl_delay
        delay = effective_delay(configured, crawl_delay, cap, h.latency_ewma, policy, allow)
        left = budget_left(h, day, policy)
        if left <= 0:
            self._defer_host(s, h.host_key, "daily fetch budget exhausted")
            s.bump("budget_exhausted", 1)
            return None
        # With a delay, one start per grant: a second grant now would break the spacing; except
        # when the gap is only the adaptive one (I8 asks no gap after a response): then starts
        # are promised one gap apart, up to SCHEDULE_AHEAD ahead (I6).
        starts = room
        if delay > 0:
            fixed = effective_delay(configured, crawl_delay, cap, None, policy)
            starts = 1 + int(SCHEDULE_AHEAD / delay) if fixed == 0 else 1
        take = int(min(room, allow - h.in_flight, starts, left))
        if delay > 0:
            take = min(take, paced)
        if take <= 0:
            return None
        check = policy.robots is not None and not policy.robots.allows_every_url(h.host_key, state)
        return _Plan(h, take, state, delay, allow, check)

    def _pick(self, s: Store, plans: Sequence[_Plan], now: float, policy: HostPolicy) -> None:
        """Each plan's best due URLs, for all hosts in one store call per round; a URL that
        robots.txt disallows becomes ``disallowed`` (I10) and the host asks again."""
        pending = list(plans)
        first = True
        while pending:
            # Rows picked in an earlier round are still 'queued' until granted: excluded.
            wants = [
                (p.host.host_key,
                 p.take - len(p.rows)
                 + ((min(ROBOTS_SLACK, p.take) if first else ROBOTS_SLACK) if p.check else 0),
                 [r[0] for r in p.rows])
                for p in pending
            ]  # fmt: skip
            first = False
            got = s.pick_urls(wants, now)
            refused: list[int] = []
            again = []
            for p, (key, want, _) in zip(pending, wants, strict=True):
                rows = got.get(key, [])
                n_refused = len(refused)
                for r in rows:
                    if len(p.rows) >= p.take:
                        break  # the rest stay queued, unchecked: robots.txt may change by then
                    if not p.check or (
                        policy.robots is not None
                        and policy.robots.allowed(key, p.state, request_url(r[1]))
                    ):
                        p.rows.append(r)
                    else:
                        refused.append(r[0])
                # Ask again only if something was refused and the queue was not exhausted.
                if len(refused) > n_refused and len(rows) >= want and len(p.rows) < p.take:
                    again.append(p)
            if refused:
                assert policy.robots is not None
                s.mark_disallowed(refused, f"robots.txt disallows {policy.robots.token}")
                s.bump("robots_disallowed", len(refused))
            pending = again

    def _lease_robots(
        self,
        s: Store,
        h: HostRow,
        owner: str,
        now: float,
        day: str,
        expires: float,
        delay: float,
        policy: HostPolicy,
    ) -> Grant | None:
        """Queue (or requeue, as a new version) the host's robots.txt and lease it (I10)."""
        allow = allowance(
            h.max_in_flight if h.max_in_flight is not None else policy.max_in_flight,
            h.error_streak,
        )
        if h.in_flight >= allow:
            return None
        url = robots.robots_url(h.host_key)
        found = s.claim_url(url)
        if found is None:
            s.insert_urls([NewURL(url, h.host_key, kind=ROBOTS)], now)
            found = s.claim_url(url)
            if found is None:
                return None  # it exists, and another transaction holds it right now
        url_id, state, kind = found
        if state == LEASED:
            return None  # already being fetched
        if state != QUEUED or kind != ROBOTS:
            # A finished copy is fetched again as a new round of the URL (R4).
            s.make_robots(url_id, now, new_round=state != QUEUED)
        row = s.pick_row(url_id)
        return self._grant_of(h, [row], ROBOTS, owner, now, day, expires, delay, allow)

    def _grant_of(
        self,
        h: HostRow,
        rows: Sequence[PickRow],
        kind: str,
        owner: str,
        now: float,
        day: str,
        expires: float,
        delay: float,
        allow: int,
    ) -> Grant | None:
        """The grant moves ``next_allowed_at`` by the delay in the same step (I6)."""
        if not rows:
            return None
        leases = [
            lease_from_row(
                r,
                h.host_key,
                self._rng.getrandbits(62) or 1,
                owner,
                expires,
                kind,
                now + i * delay if i else 0.0,
                delay > 0,
            )
            for i, r in enumerate(rows)
        ]
        used = (h.budget_used if h.budget_day == day else 0) + len(leases)
        ends = now + len(leases) * delay
        return Grant(h.host_key, leases, delay, allow, h.in_flight, ends, day, used)

    def _defer_host(
        self, s: Store, host_key: str, reason: str, *, robots_too: bool = False
    ) -> None:
        s.bump("urls_deferred", s.defer_queued(host_key, reason, robots_too=robots_too))

    def _check_fence(self, s: Store, fence: Fence, owner: str, now: float) -> None:
        """I9: refuse a stale owner before anything is granted."""
        row = s.partition(fence.partition, create=False)
        if row is None or row[1] != fence.epoch or row[0] != owner or row[2] <= now:
            current = "none" if row is None else f"epoch {row[1]} owned by {row[0]}"
            raise StaleEpoch(
                f"partition {fence.partition}: fence epoch {fence.epoch} of {owner} is stale "
                f"(current: {current})"
            )

    def acquire_partition(self, partition: int, owner: str, now: float, ttl: float) -> Fence:
        def tx(s: Store) -> Fence:
            row = s.partition(partition, create=True)
            assert row is not None
            holder, epoch, expires_at = row
            if holder == owner and expires_at > now:
                epoch = int(epoch)  # still ours: renew without a new epoch
            elif expires_at <= now or holder is None:
                epoch = int(epoch) + 1  # take over: every earlier fence becomes stale
            else:
                raise PartitionBusy(
                    f"partition {partition} is owned by {holder} for another "
                    f"{expires_at - now:.1f} s"
                )
            s.set_partition(partition, owner, epoch, now + ttl)
            return Fence(partition, epoch)

        return self._run(tx)

    def renew_partition(self, fence: Fence, owner: str, now: float, ttl: float) -> None:
        def tx(s: Store) -> None:
            if not s.renew_partition(fence.partition, owner, fence.epoch, now + ttl):
                raise StaleEpoch(
                    f"partition {fence.partition}: cannot renew epoch {fence.epoch} for {owner}"
                )

        self._run(tx)

    def complete(
        self, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        """One transaction for the batch, each completion fenced on (url_id, version, token)."""
        if not completions:
            return []
        accepted = self._run(lambda s: self._complete(s, completions, now, policy))
        self._offered(sum(len(c.links) for c, ok in zip(completions, accepted, strict=True) if ok))
        return accepted

    def _complete(
        self, s: Store, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        own = {c.lease.host_key for c in completions}
        # The hosts (its own and its links') locked first, then the fence, in one store call.
        rows, accepted = s.lock_and_finish(
            own | {u.host_key for c in completions for u in c.links}, own, completions
        )
        done = [c for c, ok in zip(completions, accepted, strict=True) if ok]
        pages = [c for c in done if c.lease.kind != ROBOTS]
        hosts: dict[str, dict[str, Any]] = {}
        robots_hosts: list[str] = []
        # robots.txt first: a Crawl-delay learnt here already spaces the next request.
        for c in done:
            if c.lease.kind == ROBOTS:
                h = hosts.setdefault(c.lease.host_key, rows[c.lease.host_key]._asdict())
                if self._store_robots(s, h, c, now, policy):
                    robots_hosts.append(c.lease.host_key)
                self._success(h, c.latency, now, policy)
        for c in pages:
            h = hosts.setdefault(c.lease.host_key, rows[c.lease.host_key]._asdict())
            self._success(h, c.latency, now, policy)
        if robots_hosts:
            s.update_hosts(
                ROBOTS_COLUMNS, [[hosts[k][c] for c in ROBOTS_COLUMNS] + [k] for k in robots_hosts]
            )
        self._write_hosts(s, hosts, rows)
        records = [
            (r.record_id, r.source, r.key, c.lease.url, r.data_json, r.content_hash, now, now)
            for c in pages
            for r in c.records
        ]
        if records:
            s.upsert_records(records)
        cookies = [k for c in pages for k in c.cookies]
        if cookies:  # I12: a session commits with the response that opened it
            s.set_cookies(cookies, now)
        links = [u for c in pages for u in c.links]
        links_new = insert_urls(s, links, now) if links else 0
        bodies = [
            (c.payload_digest, c.lease.url_id, c.lease.url, c.warc_file, c.warc_offset,
             c.warc_length, now)
            for c in pages
            if c.stored_body and c.payload_digest and c.warc_file is not None
        ]  # fmt: skip
        if bodies:
            s.insert_bodies(bodies)
        loops = [
            (f"redirect loop via {c.redirect_to}", c.lease.url_id)
            for c in pages
            if c.redirect_to is not None
            and redirect_loop(c.lease.url, c.redirect_to, s.redirect_target)
        ]
        if loops:
            s.set_last_error(loops)
            s.bump("redirect_loops", len(loops))
        # Sitemaps emit no event; a round that changed nothing (304, same body) neither (R21).
        indexed = [c for c in pages if c.lease.kind in (PAGE, DOWNLOAD) and c.changed]
        if indexed:
            s.insert_events([event_values(c, now) for c in indexed])
        n_ok = len(done)
        s.bump("fetches", n_ok)
        s.bump("completions_rejected", len(completions) - n_ok)
        s.bump("links_new", links_new)
        s.bump("url_duplicates", len(links) - links_new + sum(c.known_links for c in pages))
        for name, n in completion_counters(pages).items():
            s.bump(name, n)
        return accepted

    def _store_robots(
        self, s: Store, h: dict[str, Any], c: Completion, now: float, policy: HostPolicy
    ) -> bool:
        """Turn a robots.txt fetch into host state, keeping the last good copy (R7)."""
        if policy.robots is None or c.robots is None:
            return False
        rf = c.robots
        state = robots_outcome(
            rf.status,
            rf.body,
            now,
            policy.robots.settings,
            state_from_row(h),
            error=rf.error,
            too_many_redirects=rf.too_many_redirects,
        )
        unreachable = state.last_error is not None and not (
            rf.status is not None and 200 <= rf.status < 500 and rf.status != 429
        )
        failures = h["robots_failures"] + 1 if unreachable else 0
        if rf.permanent:
            failures = max(failures, policy.robots_max_attempts)
        h.update(state_to_row(state), robots_failures=failures)
        s.bump("robots_fetches", 1)
        own = sitemap_urls(state.sitemaps, h["host_key"])
        if own:
            s.insert_urls(own, now)
        reason = defer_reason(state, failures, policy)
        if reason is not None:
            self._defer_host(s, h["host_key"], reason)
        elif state.mode == robots.DISALLOW_ALL:
            h["backoff_until"] = max(h["backoff_until"], state.expires_at)
            h["backoff_reason"] = f"robots.txt unreachable: {state.last_error}"
        return True

    @staticmethod
    def _success(h: dict[str, Any], latency: float | None, now: float, p: HostPolicy) -> None:
        """A good answer: the error streak steps down, latency feeds the adaptive delay (R8)."""
        if latency is not None:
            h["latency_ewma"] = update_latency(h["latency_ewma"], latency)
        if h["error_streak"] <= 1 and h["backoff_until"] <= now:
            # The reason names a back-off still running (robots.txt unreachable, a 503 the
            # other requests have not cleared): it stays until that back-off is over.
            h["backoff_reason"] = None
        h["error_streak"] = max(0, h["error_streak"] - 1)
        h["next_allowed_at"] = max(h["next_allowed_at"], now + end_gap(h, p))

    def _host_error(
        self, s: Store, h: dict[str, Any], retry_after: float | None, now: float, p: HostPolicy
    ) -> float:
        """Count an error against the host and back it off (R8); returns the rest in seconds."""
        h["error_streak"] += 1
        rest, reason = backoff_seconds(h["error_streak"], retry_after, p, self._rng)
        h["backoff_until"] = max(h["backoff_until"], now + rest)
        h["backoff_reason"] = reason
        if h["error_streak"] == p.breaker_threshold:
            s.bump("breaker_trips", 1)
        s.bump("host_backoffs", 1)
        return rest

    @staticmethod
    def _write_hosts(
        s: Store, hosts: dict[str, dict[str, Any]], before: dict[str, HostRow]
    ) -> None:
        """One update per host whose state the batch changed (none for a host it did not: a
        write that changes nothing still costs a row version on PostgreSQL)."""
        changed = [
            [h[c] for c in AFTER_REQUEST_COLUMNS] + [k]
            for k, h in sorted(hosts.items())
            if any(h[c] != getattr(before[k], c) for c in AFTER_REQUEST_COLUMNS)
        ]
        if changed:
            s.update_hosts(AFTER_REQUEST_COLUMNS, changed)

    def fail(self, failures: Sequence[Failure], now: float, policy: HostPolicy) -> list[bool]:
        if not failures:
            return []
        return self._run(lambda s: self._fail(s, failures, now, policy))

    def _fail(
        self, s: Store, failures: Sequence[Failure], now: float, policy: HostPolicy
    ) -> list[bool]:
        own = {f.lease.host_key for f in failures}
        rows = s.lock_hosts(own, read=own)
        # I3: the fence first, so a stale failure changes nothing, not even the host's back-off.
        accepted = s.live_leases([f.lease for f in failures])
        hosts: dict[str, dict[str, Any]] = {}
        updates: list[FailRow] = []
        final_rows: list[tuple[int, str, str | None, float]] = []
        for f, ok in zip(failures, accepted, strict=True):
            if not ok:
                continue
            ls = f.lease
            h = hosts.setdefault(ls.host_key, rows[ls.host_key]._asdict())
            retry_at = f.retry_at
            if f.host_error:
                rest = self._host_error(s, h, f.retry_after, now, policy)
                if retry_at is not None:
                    retry_at = max(retry_at, now + rest)
            final = retry_at is None
            if final:
                final_rows.append((ls.url_id, f.error, f.trace, now))
            updates.append(
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
                )
            )
            h["next_allowed_at"] = max(h["next_allowed_at"], now + end_gap(h, policy))  # I8
            cls = status_class(f.status)
            if cls:
                s.bump(f"status_{cls}", 1)
            if f.retry_at is not None:
                s.bump("retries", 1)
        if updates:
            s.fail_leases(updates)
        if final_rows:
            s.record_failures(final_rows)
        self._write_hosts(s, hosts, rows)
        s.bump("fetches", len(updates))
        s.bump("fetch_errors", len(updates))
        s.bump("completions_rejected", len(failures) - len(updates))
        return accepted

    def expire(self, now: float) -> int:
        return self._run(lambda s: self._expire(s, now))

    def _expire(self, s: Store, now: float, *, in_lease: bool = False) -> int:
        """Return expired leases to the queue (I7). Inside ``lease`` the hosts are taken without
        waiting: a host another transaction holds right now is expired by the next call."""
        expired = s.expired_leases(now)
        if not expired:
            return 0
        hosts = {h for _, h in expired}
        held = s.lock_hosts(hosts, read=hosts, skip_locked=in_lease)
        n = s.requeue_leases([u for u, h in expired if h in held], now)
        s.bump("lease_expiries", n)
        return n

    def release_owner(self, owner: str) -> int:
        def tx(s: Store) -> int:
            s.lock_hosts(s.leased_hosts(owner))
            n = s.release_owner(owner)
            s.bump("leases_reclaimed", n)
            return n

        return self._run(tx)

    def reschedule_due(self, now: float, limit: int) -> int:
        """A new round (version + 1, R4, R16) for finished URLs whose time has come."""

        def tx(s: Store) -> int:
            due = s.due_rounds(now, limit)
            if not due:
                return 0
            s.lock_hosts({h for _, h in due})
            n = s.start_rounds([u for u, _ in due])
            s.bump("revisits", n)
            return n

        return self._run(tx)

    def requeue_deferred(self) -> int:
        """Deferred URLs get another chance, and robots.txt its full count of attempts."""

        def tx(s: Store) -> int:
            s.lock_hosts(s.deferred_hosts())
            s.reset_robots_failures()
            return s.requeue_deferred()

        return self._run(tx)

    # -- live control and per-host settings ----------------------------------------------------

    def control(self, action: str, host_key: str | None = None, value: Any = None) -> int:
        """Live control (R23): the next lease of every process sees it."""
        stored = control_value(action, host_key, value)

        def tx(s: Store) -> int:
            if host_key is None:
                s.set_meta("paused", "1" if action == "pause" else "0")
                return 1
            s.ensure_hosts([host_key])
            s.lock_hosts([host_key])
            if action == "pause":
                s.update_hosts(("paused", "pause_reason"), [(1, "paused by operator", host_key)])
            elif action in ("resume", "unblock"):
                s.update_hosts(("paused", "pause_reason"), [(0, None, host_key)])
                if action == "unblock":
                    s.requeue_deferred(host_key, BLOCKED)
            elif action == "block":
                s.update_hosts(("paused", "pause_reason"), [(1, BLOCKED, host_key)])
                self._defer_host(s, host_key, BLOCKED, robots_too=True)
            elif action == "set-delay":
                s.update_hosts(("delay",), [(stored, host_key)])
            else:
                s.update_hosts(("budget",), [(stored, host_key)])
            return 1

        return self._run(tx)

    def set_host_overrides(
        self, host_key: str, *, delay: float | None, max_in_flight: int | None
    ) -> None:
        def tx(s: Store) -> None:
            s.ensure_hosts([host_key])
            s.update_hosts(("delay", "max_in_flight"), [(delay, max_in_flight, host_key)])

        self._run(tx)

    def apply_reparse(self, items: Sequence[Reparsed], now: float) -> int:
        if not items:
            return 0

        def tx(s: Store) -> int:
            good = [it for it in items if it.error is None]
            links = [u for it in good for u in it.links]
            s.lock_hosts({u.host_key for u in links})
            records = [
                (r.record_id, r.source, r.key, it.url, r.data_json, r.content_hash, now, now)
                for it in good
                for r in it.records
            ]
            if records:
                s.upsert_records(records)
            new = insert_urls(s, links, now) if links else 0
            s.reparse_outcome([(it.error, it.url_id) for it in items])
            # A page that fails again keeps its newest reason and traceback.
            s.record_failures(
                [(it.url_id, it.error, it.trace, now) for it in items if it.error is not None]
            )
            s.bump("reparsed", len(items))
            s.bump("links_new", new)
            return len(records)

        return self._run(tx)

    def set_meta(self, key: str, value: str) -> None:
        self._run(lambda s: s.set_meta(key, value))

    def add_seeds(self, host_keys: Iterable[str]) -> None:
        keys = list(host_keys)
        if keys:
            self._run(lambda s: s.add_seeds(keys))

    def set_cursor(self, consumer: str, cursor: int) -> None:
        self._run(lambda s: s.set_cursor(consumer, cursor))
