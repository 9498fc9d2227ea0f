"""``PartitionedFrontier``: the frontier contract over P partitions, by routing.

Each partition is an ordinary PostgreSQL frontier (``partition.PartitionFrontier``) in schema
``<crawl>_pNNN`` on its server (``partition_map``). This class holds one handle per partition
and routes every call of the contract (``frontier/base.py``):

* **Hosts decide partitions.** ``add``, ``control``/``set_host_overrides`` of a host and
  ``host_row`` go to ``partition_of(host_key)``; all politeness state of a host is in one
  partition, so I6/I8/I10 stay local transactions.
* **A lease names its partition**: the crawl-wide ``url_id`` is ``partition << 40 | local id``
  (``partition_map.global_id``). ``complete``/``fail`` decode it and go to that partition with
  the partition's own id; everything this class returns that carries a url_id (leases, URL rows,
  events, simhashes, reparse candidates) carries the crawl-wide one.
* **Leasing is fenced by ownership.** ``lease`` first lets the caller's
  :class:`~.membership.Membership` tick (heartbeat, renew, rebalance), forwards the outboxes of
  the partitions it owns, then leases only from owned partitions, each with its ``Fence``; a
  partition whose fence turned stale (``StaleEpoch``) is dropped and grants nothing (I9). The
  ``fence`` argument of the contract is for a single partition and is refused here.
* **Discovery crosses partitions through outboxes** (``partition.py``): links and records a
  completion produced for other partitions commit in the completing partition's
  ``fleet_outbox``; :meth:`forward` copies them with insert-if-absent / the record upsert and
  then deletes them. ``progress`` counts undelivered outbox rows as queued, so no member
  finishes while a link is still on its way.
* **Records live in the partition of their record id** (``PartitionMap.of_record``), so a key
  yielded by pages of two hosts in different partitions is one row.
* **Crawl-wide state** (meta, seeds, consumer cursors) lives in partition 0.
* **Reads** fan out and combine: counts add up, streams concatenate in partition order (URLs,
  events) or merge by key (records).
"""

from __future__ import annotations

import heapq
import itertools
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import psycopg

from ..frontier.away import retry_while_away
from ..frontier.base import (
    Completion,
    Failure,
    Fence,
    FrontierError,
    FrontierStats,
    HostPolicy,
    Lease,
    NewURL,
    Progress,
    Reparsed,
    StaleEpoch,
    control_value,
)
from ..url import host_key as url_host_key
from .membership import OWNERSHIP_TTL, TICK_EVERY, Membership, MembersTable
from .partition import LINK, RECORD, PartitionFrontier, url_from_payload
from .partition_map import (
    LOCAL_ID_BITS,
    LOCAL_ID_MASK,
    MAP_TABLES,
    PartitionMap,
    connect,
    global_id,
    load_map,
    local_id,
)

T = TypeVar("T")

#: Outbox rows forwarded per partition per forward call.
FORWARD_BATCH = 500
#: How long a partition call may keep retrying a lost server. Writes that must not be lost
#: (completions, failures, adds) wait this long, as on one database ...
PARTITION_RETRY_SECONDS = 60.0
#: ... but what can wait for the next round (leasing, ownership, forwarding, progress) gives up
#: after this, and the server is then skipped for ``DOWN_FOR`` seconds, so one server's outage
#: never stalls a member's other partitions past their ownership TTL.
QUICK_RETRY_SECONDS = 1.0
DOWN_FOR = 2.0
#: Home of crawl-wide state (meta, seeds, cursors).
HOME = 0

__all__ = ["PartitionedFrontier", "init_map", "open_partitioned"]


def pack_cursor(vector: Sequence[int]) -> int:
    """Per-partition event ids as one integer: partition p's id in bits [40p, 40p + 40)."""
    out = 0
    for p, eid in enumerate(vector):
        if not 0 <= eid <= LOCAL_ID_MASK:
            raise FrontierError(f"event id {eid} of partition {p} does not fit a cursor")
        out |= eid << (LOCAL_ID_BITS * p)
    return out


def unpack_cursor(cursor: int, partitions: int) -> list[int]:
    if cursor < 0 or cursor >> (LOCAL_ID_BITS * partitions):
        raise FrontierError(f"{cursor} is not an event cursor of this {partitions}-partition crawl")
    return [(cursor >> (LOCAL_ID_BITS * p)) & LOCAL_ID_MASK for p in range(partitions)]


def _min(values: Iterable[float | None]) -> float | None:
    return min((v for v in values if v is not None), default=None)


class ServerDown(FrontierError):
    """A partition's server did not answer recently; the call was not tried."""


class Quick:
    """Calls that may be skipped when a partition's server is away: a short retry, then the
    server is marked down for ``DOWN_FOR`` seconds (monotonic: this is about the network, not
    the crawl's clock) and later quick calls to it fail at once with :class:`ServerDown`."""

    def __init__(self, retry: float = QUICK_RETRY_SECONDS) -> None:
        self.retry = retry
        self.down_until: dict[str, float] = {}

    def __call__(self, part: PartitionFrontier, fn: Callable[[], T]) -> T:
        until = self.down_until.get(part.dsn, 0.0)
        if time.monotonic() < until:
            raise ServerDown(f"partition {part.partition}: its server is away; later")
        saved, part.retry_seconds = part.retry_seconds, self.retry
        try:
            return fn()
        except FrontierError as exc:
            if isinstance(exc.__cause__, psycopg.OperationalError):
                self.down_until[part.dsn] = time.monotonic() + DOWN_FOR
            raise
        finally:
            part.retry_seconds = saved


class QuickPartition:
    """A partition as membership sees it (``membership.OwnedPartition``), through ``Quick``."""

    def __init__(self, part: PartitionFrontier, quick: Quick) -> None:
        self.part = part
        self.partition = part.partition
        self._q = quick

    def acquire_partition(self, partition: int, owner: str, now: float, ttl: float) -> Fence:
        return self._q(self.part, lambda: self.part.acquire_partition(partition, owner, now, ttl))

    def renew_partition(self, fence: Fence, owner: str, now: float, ttl: float) -> None:
        self._q(self.part, lambda: self.part.renew_partition(fence, owner, now, ttl))

    def owner_row(self) -> tuple[str | None, int, float] | None:
        return self._q(self.part, self.part.owner_row)

    def log_ownership(self, owner: str, epoch: int, acquired_at: float, expires_at: float) -> None:
        self._q(self.part, lambda: self.part.log_ownership(owner, epoch, acquired_at, expires_at))

    def log_release(self, epoch: int, released_at: float) -> None:
        self._q(self.part, lambda: self.part.log_release(epoch, released_at))


class PartitionedFrontier:
    """The frontier contract over a partition map (see the module docstring)."""

    def __init__(
        self,
        pmap: PartitionMap,
        *,
        ttl: float = OWNERSHIP_TTL,
        tick_every: float = TICK_EVERY,
        retry_seconds: float = PARTITION_RETRY_SECONDS,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.pmap = pmap
        self.ttl = ttl
        self.tick_every = tick_every
        self._say = say
        self.parts: dict[int, PartitionFrontier] = {}
        self._members: dict[str, Membership] = {}
        self.members_table = MembersTable(pmap.servers[0], pmap.crawl)
        try:
            deadline = time.monotonic() + retry_seconds
            for p in range(pmap.partitions):
                self.parts[p] = self._open_partition(p, retry_seconds, deadline)
        except BaseException:
            self.close()
            raise
        self.quick = Quick()
        self._owned_view = {p: QuickPartition(f, self.quick) for p, f in self.parts.items()}
        #: What owner slots (``owner.py``) are keyed by: the same for every server URL of this
        #: crawl, so two processes of one machine never share an owner id or WARC prefix.
        self.crawl_identity = f"fleet:{pmap.crawl}@{pmap.servers[0]}"
        self._rotate = 0
        #: Each partition's cookies as last read (``cookies``: a server away gives these).
        self._jars: dict[int, list[Any]] = {}

    # -- plumbing --------------------------------------------------------------------------------

    def _open_partition(self, p: int, retry_seconds: float, deadline: float) -> PartitionFrontier:
        """Open partition ``p``; a server that is away (restarting) is waited for until
        ``deadline``, as a running member waits for it, instead of failing the start
        (``frontier.away.retry_while_away``, which ``open_frontier`` waits with too)."""

        def waiting(exc: FrontierError) -> None:
            if self._say:
                self._say(f"partition {p}: waiting for its server ({exc})")

        return retry_while_away(
            lambda: PartitionFrontier(
                self.pmap.server(p),
                p,
                schema=self.pmap.schema(p),
                partitions=self.pmap.partitions,
                create=False,
                retry_seconds=retry_seconds,
            ),
            deadline,
            waiting,
        )

    def _part(self, partition: int) -> PartitionFrontier:
        part = self.parts.get(partition)
        if part is None:
            raise FrontierError(f"no partition {partition} in crawl {self.pmap.crawl}")
        return part

    def _of_host(self, host_key: str) -> PartitionFrontier:
        return self.parts[self.pmap.of_host(host_key)]

    def _all(self, fn: Callable[[PartitionFrontier], T]) -> list[T]:
        return [fn(self.parts[p]) for p in sorted(self.parts)]

    def _decode(self, lease: Lease) -> tuple[int, Lease]:
        p, local = local_id(lease.url_id)
        return p, replace(lease, url_id=local)

    def membership(self, owner: str) -> Membership:
        """The membership of ``owner`` (one per owner id this process leases as)."""
        m = self._members.get(owner)
        if m is None:
            m = Membership(
                owner,
                self.pmap,
                self._owned_view,
                self.members_table,
                ttl=self.ttl,
                tick_every=self.tick_every,
                say=self._say,
            )
            self._members[owner] = m
        return m

    def leave(self, now: float | None = None) -> None:
        """Clean stop: every member of this process hands its partitions back."""
        for m in self._members.values():
            m.leave(now)

    def ownership_log(self) -> list[dict[str, Any]]:
        """Every partition's ownership terms (partition, epoch, owner, acquired_at,
        expires_at, released_at), by partition and epoch."""
        return [row for rows in self._all(lambda f: f.ownership_log()) for row in rows]

    # -- the cross-partition flow ----------------------------------------------------------------

    def forward(self, partitions: Iterable[int] | None = None, batch: int = FORWARD_BATCH) -> int:
        """Drain the outboxes of ``partitions`` (default all) into their targets, one batch
        each; returns rows delivered. Insert-if-absent and the record upsert make a repeated
        delivery (a crash between delivering and deleting) a no-op."""
        delivered = 0
        for p in sorted(self.parts) if partitions is None else partitions:
            try:
                delivered += self._forward_one(self.parts[p], batch)
            except FrontierError as exc:  # a server away: the rows wait in the outbox
                if self._say:
                    self._say(f"forwarding partition {p} postponed: {exc}")
        return delivered

    def _forward_one(self, source: PartitionFrontier, batch: int) -> int:
        q = self.quick
        rows = q(source, lambda: source.outbox_batch(batch))
        if not rows:
            return 0
        links: dict[int, list[NewURL]] = defaultdict(list)
        records: dict[int, list[list[Any]]] = defaultdict(list)
        for _, target, kind, payload in rows:
            if kind == LINK:
                links[target].append(url_from_payload(payload))
            elif kind == RECORD:
                records[target].append(json.loads(payload))
            else:
                raise FrontierError(
                    f"partition {source.partition}: unknown outbox row kind {kind!r}"
                )
        now = self._forward_now()
        for target, urls in links.items():
            part = self._part(target)
            # When a forwarded link was produced is not known here: it enters its partition now.
            q(part, lambda part=part, urls=urls: part.add(urls, now))
        for target, recs in records.items():
            part = self._part(target)
            q(part, lambda part=part, recs=recs: part.upsert_records(recs))
        q(source, lambda: source.outbox_delete([r[0] for r in rows]))
        return len(rows)

    def _forward_now(self) -> float:
        """The clock of the last lease call (the crawl's clock, virtual in tests)."""
        return self._last_now if self._last_now is not None else 0.0

    _last_now: float | None = None

    # -- scheduling core ---------------------------------------------------------------------------

    def add(self, urls: Iterable[NewURL], now: float) -> int:
        by_part: dict[int, list[NewURL]] = defaultdict(list)
        for u in urls:
            by_part[self.pmap.of_host(u.host_key)].append(u)
        return sum(self.parts[p].add(batch, now) for p, batch in sorted(by_part.items()))

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
        if fence is not None:
            raise FrontierError(
                "a partitioned crawl fences its partitions itself; lease without a fence"
            )
        self._last_now = now
        m = self.membership(owner)
        if m.due(now):
            m.tick(now)
            self.forward(sorted(m.owned))
        if limit <= 0 or not m.owned:
            return []
        owned = sorted(m.owned)
        start = self._rotate % len(owned)
        self._rotate += 1
        out: list[Lease] = []
        for p in owned[start:] + owned[:start]:
            if len(out) >= limit:
                break
            f = m.fence(p)
            if f is None:
                continue
            part, n = self.parts[p], limit - len(out)
            # The paced bound is the call's: each partition may use what the others left.
            left = None if paced is None else paced - sum(x.paced for x in out)
            try:
                got = self.quick(
                    part,
                    lambda: part.lease(owner, n, now, lease_seconds, policy, f, left),  # noqa: B023
                )
            except StaleEpoch as exc:
                m.drop(p, str(exc))
                continue
            except FrontierError as exc:
                if self._say:
                    self._say(f"partition {p} unavailable: {exc}")
                continue
            out.extend(replace(x, url_id=global_id(p, x.url_id)) for x in got)
        return out

    def _grouped(
        self,
        items: Sequence[Any],
        call: Callable[[PartitionFrontier, list[Any]], list[bool]],
    ) -> list[bool]:
        groups: dict[int, list[tuple[int, Any]]] = defaultdict(list)
        for i, item in enumerate(items):
            p, lease = self._decode(item.lease)
            groups[p].append((i, replace(item, lease=lease)))
        accepted = [False] * len(items)
        for p, group in sorted(groups.items()):
            oks = call(self._part(p), [item for _, item in group])
            for (i, _), ok in zip(group, oks, strict=True):
                accepted[i] = ok
        return accepted

    def complete(
        self, completions: Sequence[Completion], now: float, policy: HostPolicy
    ) -> list[bool]:
        """Each completion commits in its lease's partition (with its outbox rows)."""
        return self._grouped(completions, lambda f, batch: f.complete(batch, now, policy))

    def fail(self, failures: Sequence[Failure], now: float, policy: HostPolicy) -> list[bool]:
        return self._grouped(failures, lambda f, batch: f.fail(batch, now, policy))

    def expire(self, now: float) -> int:
        return sum(self._all(lambda f: f.expire(now)))

    def release_owner(self, owner: str) -> int:
        return sum(self._all(lambda f: f.release_owner(owner)))

    def progress(self, now: float, max_in_flight: int | None = None) -> Progress:
        """The whole crawl's progress; undelivered outbox rows count as queued work that is
        ready now (the next lease call forwards them)."""
        ps: list[Progress] = []
        pending = unknown = 0
        for p in sorted(self.parts):
            part = self.parts[p]
            try:
                ps.append(self.quick(part, lambda part=part: part.progress(now, max_in_flight)))
                pending += self.quick(part, part.outbox_count)
            except FrontierError:
                unknown += 1  # a server away: its partitions are not known to be finished
        soon = now + self.tick_every if pending or unknown else None
        return Progress(
            queued=sum(p.queued for p in ps) + pending + unknown,
            leased=sum(p.leased for p in ps),
            next_due_at=_min([*(p.next_due_at for p in ps), soon]),
            next_lease_expiry=_min(p.next_lease_expiry for p in ps),
            next_host_ready_at=_min(p.next_host_ready_at for p in ps),
            next_refetch_at=_min(p.next_refetch_at for p in ps),
            next_ready_at=_min([*(p.next_ready_at for p in ps), soon]),
        )

    def reschedule_due(self, now: float, limit: int) -> int:
        done = 0
        for p in sorted(self.parts):
            if done >= limit:
                break
            done += self.parts[p].reschedule_due(now, limit - done)
        return done

    def requeue_deferred(self) -> int:
        return sum(self._all(lambda f: f.requeue_deferred()))

    # -- fleet -------------------------------------------------------------------------------------

    def acquire_partition(self, partition: int, owner: str, now: float, ttl: float) -> Fence:
        return self._part(partition).acquire_partition(partition, owner, now, ttl)

    def renew_partition(self, fence: Fence, owner: str, now: float, ttl: float) -> None:
        self._part(fence.partition).renew_partition(fence, owner, now, ttl)

    def owners_with_leases(self) -> list[str]:
        return sorted({o for owners in self._all(lambda f: f.owners_with_leases()) for o in owners})

    # -- control -----------------------------------------------------------------------------------

    def control(self, action: str, host_key: str | None = None, value: Any = None) -> int:
        control_value(action, host_key, value)  # refuse before touching any partition
        if host_key is None:
            return sum(self._all(lambda f: f.control(action, None, value)))
        return self._of_host(host_key).control(action, host_key, value)

    def set_host_overrides(
        self, host_key: str, *, delay: float | None, max_in_flight: int | None
    ) -> None:
        self._of_host(host_key).set_host_overrides(
            host_key, delay=delay, max_in_flight=max_in_flight
        )

    # -- crawl state -------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        return self.parts[HOME].get_meta(key)

    def set_meta(self, key: str, value: str) -> None:
        self.parts[HOME].set_meta(key, value)

    def add_seeds(self, host_keys: Iterable[str]) -> None:
        self.parts[HOME].add_seeds(host_keys)

    def seed_hosts(self) -> frozenset[str]:
        return self.parts[HOME].seed_hosts()

    def known_urls(self, after_id: int = 0, limit: int | None = None) -> list[tuple[int, str]]:
        """By crawl-wide id: partition by partition, each by its own ids."""
        first, after_local = local_id(after_id) if after_id > 0 else (0, 0)
        out: list[tuple[int, str]] = []
        for p in range(first, self.pmap.partitions):
            want = None if limit is None else limit - len(out)
            if want is not None and want <= 0:
                break
            rows = self.parts[p].known_urls(after_local if p == first else 0, want)
            out.extend((global_id(p, i), u) for i, u in rows)
        return out

    def cookies(self, now: float) -> list[Any]:
        """The crawl's jar: each partition keeps the cookies its completions brought; a cookie
        (domain, path, name) in several partitions counts once, the highest partition's.

        A partition whose server is away gives the cookies it gave last (quick calls, as
        leasing does): a crawl reloads its jar after every lease call, and waiting a minute
        for one server would stall the partitions of every other. Its newer cookies arrive
        when it is back (until then I12 holds for the partitions that answer)."""
        jar: dict[tuple[str, str, str], Any] = {}
        for p in sorted(self.parts):
            part = self.parts[p]
            try:
                got = self.quick(part, lambda part=part: part.cookies(now))
                self._jars[p] = got
            except FrontierError:
                got = [c for c in self._jars.get(p, ()) if c.expires is None or c.expires > now]
            jar.update(((c.domain, c.path, c.name), c) for c in got)
        return list(jar.values())

    def find_bodies(self, digests: Sequence[str]) -> dict[str, tuple[str, int, int, str]]:
        found: dict[str, tuple[str, int, int, str]] = {}
        for p in sorted(self.parts):
            left = [d for d in digests if d not in found]
            if not left:
                break
            found.update(self.parts[p].find_bodies(left))
        return found

    def body_digests(self, after: str = "", limit: int | None = None) -> list[str]:
        """In digest order across every partition (a merge of each one's next page)."""
        pages = self._all(lambda f: f.body_digests(after, limit))
        merged = sorted({d for page in pages for d in page})
        return merged if limit is None else merged[:limit]

    def simhashes(
        self, after_id: int = 0, limit: int | None = None
    ) -> list[tuple[int, int, int | None]]:
        """By crawl-wide id, partition by partition (``near_dup_of`` is stored crawl-wide)."""
        first, after_local = local_id(after_id) if after_id > 0 else (0, 0)
        out: list[tuple[int, int, int | None]] = []
        for p in range(first, self.pmap.partitions):
            want = None if limit is None else limit - len(out)
            if want is not None and want <= 0:
                break
            rows = self.parts[p].simhashes(after_local if p == first else 0, want)
            out.extend((global_id(p, u), h, dup) for u, h, dup in rows)
        return out

    def reparse_candidates(
        self, where_failed: bool, after_id: int, limit: int
    ) -> list[dict[str, Any]]:
        first, after_local = local_id(after_id) if after_id > 0 else (0, 0)
        out: list[dict[str, Any]] = []
        for p in range(first, self.pmap.partitions):
            after = after_local if p == first else 0
            rows = self.parts[p].reparse_candidates(where_failed, after, limit - len(out))
            out.extend({**r, "url_id": global_id(p, r["url_id"])} for r in rows)
            if len(out) >= limit:
                break
        return out

    def apply_reparse(self, items: Sequence[Reparsed], now: float) -> int:
        """Each page's outcome in its partition; its links and records go where they live
        (directly: a re-parse is repeatable, so it needs no outbox)."""
        groups: dict[int, list[Reparsed]] = defaultdict(list)
        foreign_links: list[NewURL] = []
        written = 0
        for it in items:
            p, local = local_id(it.url_id)
            mine = [u for u in it.links if self.pmap.of_host(u.host_key) == p]
            if it.error is None:
                foreign_links += [u for u in it.links if self.pmap.of_host(u.host_key) != p]
                away = [r for r in it.records if self.pmap.of_record(r.record_id) != p]
                by_target: dict[int, list[list[Any]]] = defaultdict(list)
                for r in away:
                    by_target[self.pmap.of_record(r.record_id)].append(
                        [r.record_id, r.source, r.key, it.url, r.data_json, r.content_hash, now]
                    )
                for target, rows in by_target.items():
                    self.parts[target].upsert_records(rows)
                written += len(away)
                records = [r for r in it.records if self.pmap.of_record(r.record_id) == p]
            else:
                records = list(it.records)
            groups[p].append(replace(it, url_id=local, links=mine, records=records))
        for p, batch in sorted(groups.items()):
            written += self._part(p).apply_reparse(batch, now)
        if foreign_links:
            self.add(foreign_links, now)
        return written

    # -- outputs -----------------------------------------------------------------------------------

    def stats(self) -> FrontierStats:
        out = FrontierStats()
        for s in self._all(lambda f: f.stats()):
            for k, v in s.urls_by_state.items():
                out.urls_by_state[k] = out.urls_by_state.get(k, 0) + v
            for k, v in s.counters.items():
                out.counters[k] = out.counters.get(k, 0) + v
            out.hosts += s.hosts
            out.records += s.records
            out.events += s.events
        out.meta = self.parts[HOME].stats().meta
        return out

    def aggregates(self) -> dict[str, Any]:
        total: dict[str, Any] = {}
        for a in self._all(lambda f: f.aggregates()):
            for k, v in a.items():
                if isinstance(v, dict):
                    d = total.setdefault(k, {})
                    for kk, vv in v.items():
                        d[kk] = d.get(kk, 0) + vv
                else:
                    total[k] = total.get(k, 0) + v
        for k, v in total.items():
            if isinstance(v, dict):
                total[k] = dict(sorted(v.items()))
        return total

    def hosts_report(self, now: float) -> list[dict[str, Any]]:
        rows = [r for rs in self._all(lambda f: f.hosts_report(now)) for r in rs]
        return sorted(rows, key=lambda r: r["host_key"])

    def lease_audit(self) -> dict[str, Any]:
        """Violations add up exactly (each host's lease log is in one partition); the delay
        percentiles are the worst partition's, an upper bound of the crawl's."""
        audits = self._all(lambda f: f.lease_audit())
        by_host: dict[str, int] = {}
        for a in audits:
            by_host.update(a["violations_by_host"])

        def worst(key: str) -> float | None:
            vals = [a["eligibility_delay_s"][key] for a in audits]
            return max((v for v in vals if v is not None), default=None)

        return {
            "grants": sum(a["grants"] for a in audits),
            "violations": sum(a["violations"] for a in audits),
            "violations_by_host": dict(sorted(by_host.items())),
            "eligibility_delay_s": {k: worst(k) for k in ("p50", "p99", "max")},
        }

    def eligibility_delay_histogram(self, bounds: Sequence[float]) -> dict[str, Any]:
        hists = self._all(lambda f: f.eligibility_delay_histogram(bounds))
        out = dict(hists[0])
        out["counts"] = [sum(col) for col in zip(*(h["counts"] for h in hists), strict=True)]
        out["sum"] = sum(h["sum"] for h in hists)
        return out

    def recent_errors(self, limit: int) -> list[dict[str, Any]]:
        rows = [r for rs in self._all(lambda f: f.recent_errors(limit)) for r in rs]
        rows.sort(key=lambda r: r.get("fetched_at") or 0.0, reverse=True)
        return rows[:limit]

    def failure_reasons(self, limit: int) -> list[dict[str, Any]]:
        """Counts of a reason add up over the partitions and its first failure is the earliest
        of theirs. Each partition is asked for more groups than wanted, but a reason outside
        every partition's share can still be missed: the ranking is a close approximation."""
        merged: dict[str, dict[str, Any]] = {}
        for rows in self._all(lambda f: f.failure_reasons(4 * limit)):
            for r in rows:
                g = merged.get(r["reason"])
                if g is None:
                    merged[r["reason"]] = dict(r)
                    continue
                urls = g["urls"] + r["urls"]
                if r["failed_at"] < g["failed_at"]:
                    g.update(r)
                g["urls"] = urls
        return sorted(merged.values(), key=lambda g: (-g["urls"], g["reason"]))[:limit]

    def records(self) -> Iterable[dict[str, Any]]:
        return heapq.merge(
            *self._all(lambda f: list(f.records())), key=lambda r: (r["source"], r["key"])
        )

    # Events: each partition numbers its own events in commit order, so the crawl-wide cursor
    # is the vector of per-partition event ids, packed into one (large) integer, 40 bits per
    # partition (``pack_cursor``). It resumes exactly: every component only moves past events
    # that were returned, and each partition's order never skips a late commit.

    def events_after(self, cursor: int, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` events after the vector ``cursor``, oldest ``created_at`` first across
        partitions; each row's ``event_id`` is the cursor just after it (pass the last one
        back), ``partition`` and ``partition_event_id`` say where it is stored."""
        if limit <= 0:
            return []
        vector = unpack_cursor(cursor, self.pmap.partitions)
        per_part = [
            [
                (r["created_at"], p, r["event_id"], r)
                for r in self.parts[p].events_after(vector[p], limit)
            ]
            for p in sorted(self.parts)
        ]
        # heapq.merge only compares the heads, so each partition's events keep their id order
        # even where their created_at is not monotonic: no component ever jumps past an event.
        heads = list(itertools.islice(heapq.merge(*per_part, key=lambda h: (h[0], h[1])), limit))
        out: list[dict[str, Any]] = []
        for _, p, eid, r in heads:
            vector[p] = max(vector[p], eid)
            out.append(
                {
                    **r,
                    "event_id": pack_cursor(vector),
                    "url_id": global_id(p, r["url_id"]),
                    "partition": p,
                    "partition_event_id": eid,
                }
            )
        return out

    def get_cursor(self, consumer: str) -> int:
        return pack_cursor([self.parts[p].get_cursor(consumer) for p in sorted(self.parts)])

    def set_cursor(self, consumer: str, cursor: int) -> None:
        """Each partition keeps the maximum of its component, so a late or repeated
        acknowledgement rewinds nothing (as on one database)."""
        vector = unpack_cursor(cursor, self.pmap.partitions)
        for p in sorted(self.parts):
            if vector[p]:
                self.parts[p].set_cursor(consumer, vector[p])

    def iter_urls(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        for p in sorted(self.parts):
            for r in self.parts[p].iter_urls(batch):
                yield {**r, "url_id": global_id(p, r["url_id"])}

    def iter_events(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        for p in sorted(self.parts):
            for r in self.parts[p].iter_events(batch):
                yield {
                    **r,
                    "event_id": global_id(p, r["event_id"]),
                    "url_id": global_id(p, r["url_id"]),
                }

    def iter_records(self, batch: int = 1000) -> Iterator[dict[str, Any]]:
        return heapq.merge(
            *self._all(lambda f: f.iter_records(batch)), key=lambda r: r["record_id"]
        )

    # -- inspection --------------------------------------------------------------------------------

    def url_row(self, url: str) -> dict[str, Any] | None:
        for p in sorted(self.parts):
            row = self.parts[p].url_row(url)
            if row is not None:
                return {**row, "url_id": global_id(p, row["url_id"])}
        return None

    def host_row(self, host_key: str) -> dict[str, Any] | None:
        return self._of_host(host_key).host_row(host_key)

    def url_rows(self) -> list[dict[str, Any]]:
        return [
            {**r, "url_id": global_id(p, r["url_id"])}
            for p in sorted(self.parts)
            for r in self.parts[p].url_rows()
        ]

    def host_rows(self) -> list[dict[str, Any]]:
        rows = [r for rs in self._all(lambda f: f.host_rows()) for r in rs]
        return sorted(rows, key=lambda r: r["host_key"])

    def existing_urls(self, candidates: Sequence[str]) -> set[str]:
        by_part: dict[int, list[str]] = defaultdict(list)
        for u in candidates:
            by_part[self.pmap.of_host(url_host_key(u))].append(u)
        return set(
            itertools.chain.from_iterable(
                self.parts[p].existing_urls(us) for p, us in sorted(by_part.items())
            )
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    def migrate(self) -> int:
        return min(self._all(lambda f: f.migrate()))

    def close(self) -> None:
        try:
            self.leave()
        finally:
            for f in self.parts.values():
                f.close()
            members = getattr(self, "members_table", None)
            if members is not None:
                members.close()


def open_partitioned(dsn: str, schema: str | None, **kw: Any) -> PartitionedFrontier | None:
    """The partitioned crawl whose map is in ``schema`` at ``dsn``; None for an ordinary one."""
    # An unreachable server raises (ServerUnreachable): returning None would let the caller
    # open the schema as an ordinary crawl, and create one there if the server came back in
    # between.
    pmap = load_map(dsn, schema or "idemcrawl")
    return None if pmap is None else PartitionedFrontier(pmap, **kw)


def init_map(pmap: PartitionMap) -> None:
    """Create the crawl: every partition's schema (a migrated frontier plus its fleet tables)
    and the map on every server. Running it again with the same map is a no-op; with a
    different map for an existing crawl it refuses (moving partitions is not done here)."""
    for dsn in pmap.servers:
        existing = load_map(dsn, pmap.crawl)
        if existing is not None and existing != pmap:
            raise FrontierError(
                f"{dsn} already holds crawl {pmap.crawl} with a different partition map "
                f"({existing.partitions} partitions over {len(existing.servers)} servers)"
            )
    for p in range(pmap.partitions):
        PartitionFrontier(pmap.server(p), p, schema=pmap.schema(p), create=True).close()
    for dsn in pmap.servers:
        with connect(dsn) as conn:
            s = f'"{pmap.crawl}"'
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            for ddl in MAP_TABLES:
                conn.execute(ddl.format(s=s))
            conn.execute(
                f"INSERT INTO {s}.fleet_map (key, value) VALUES ('map', %s) "
                "ON CONFLICT (key) DO NOTHING",
                (pmap.to_json(),),
            )


def init_crawl(dbs: Sequence[str], partitions: int) -> PartitionMap:
    """``idemcrawl db init``: make the partitioned crawl named by the DSNs' ``schema=`` (all
    the same, default ``idemcrawl``) over their servers, and return its map."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    servers: list[str] = []
    names: set[str] = set()
    for db in dbs:
        if not db.startswith(("postgresql://", "postgres://")):
            raise FrontierError(f"a partitioned crawl lives on PostgreSQL servers, not {db!r}")
        parts = urlsplit(db)
        query = parse_qsl(parts.query, keep_blank_values=True)
        names.add(next((v for k, v in query if k == "schema"), "idemcrawl"))
        rest = urlencode([(k, v) for k, v in query if k != "schema"])
        servers.append(urlunsplit(parts._replace(query=rest)))
    if len(names) > 1:
        raise FrontierError(f"the --db URLs name different crawls (schemas {sorted(names)})")
    pmap = PartitionMap(names.pop() if names else "idemcrawl", partitions, tuple(servers))
    init_map(pmap)
    return pmap
