"""Members of a partitioned crawl and the partitions each owns.

Every crawl process is a **member**. It heartbeats into ``fleet_members`` (the crawl schema on
the map's first server), counts the live members (heartbeat unexpired, not left) and aims for
a fair share, ``ceil(P / live)`` partitions. Ownership itself is the frontier's partition lease
with a fencing epoch (``Frontier.acquire_partition`` / ``renew_partition``, invariant I9), kept
in each partition's own schema, so it never depends on the membership server: if that server is
down, members keep (and renew) what they own and only rebalancing waits.

One :meth:`Membership.tick` (driven by the caller's clock, so the simulator and tests run it in
virtual time) does, in order:

1. heartbeat and read the live members (keeping the last view if the server does not answer);
2. renew every owned partition (a refused renewal means someone took over: dropped at once);
3. hand back surplus partitions above the fair share (cooperative rebalancing when a member
   joins): the ownership lease is cut to ``now`` so the next taker gets a new epoch;
4. acquire free or expired partitions up to the fair share, in an order hashed from the member
   id (rendezvous hashing), so members that start together do not all fight for partition 0.

A dead member stops heartbeating and renewing: after its heartbeat TTL the others count fewer
members and raise their share, and after its ownership TTL they can acquire its partitions.

The **ownership log** (``fleet_ownership`` in each partition's schema) records each term:
(partition, epoch, owner, acquired_at, expires_at, released_at), written after the frontier
accepted the acquisition or renewal, so the log never claims more than the frontier allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..frontier.base import Fence, FrontierError, PartitionBusy, StaleEpoch
from .partition_map import PartitionMap, stable_hash

#: Defaults: ownership and heartbeat TTL, and how often a member ticks.
OWNERSHIP_TTL = 15.0
TICK_EVERY = 2.0


@dataclass(slots=True)
class Owned:
    fence: Fence
    acquired_at: float


class OwnedPartition(Protocol):
    """What membership needs of a partition: the contract's ownership lease (``Fleet``) plus
    the ownership log (``partition.PartitionFrontier``; the simulator keeps both in memory)."""

    partition: int

    def acquire_partition(self, partition: int, owner: str, now: float, ttl: float) -> Fence: ...

    def renew_partition(self, fence: Fence, owner: str, now: float, ttl: float) -> None: ...

    def owner_row(self) -> tuple[str | None, int, float] | None: ...

    def log_ownership(
        self, owner: str, epoch: int, acquired_at: float, expires_at: float
    ) -> None: ...

    def log_release(self, epoch: int, released_at: float) -> None: ...


class Members(Protocol):
    """Where members heartbeat (``MembersTable`` on a server; the simulator's in memory)."""

    def heartbeat(self, member: str, now: float, ttl: float) -> list[str]: ...

    def leave(self, member: str, now: float) -> None: ...


class MembersTable:
    """The heartbeat table (``fleet_members``) on the map's first server."""

    def __init__(self, dsn: str, crawl: str) -> None:
        self.dsn = dsn
        self.table = f'"{crawl}".fleet_members'
        self._conn: Any = None

    def _cursor(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.dsn, connect_timeout=3, autocommit=True)
        return self._conn

    def heartbeat(self, member: str, now: float, ttl: float) -> list[str]:
        """Record that ``member`` lives until ``now + ttl``; return the live members."""
        conn = self._cursor()
        conn.execute(
            f"INSERT INTO {self.table} (member, joined_at, heartbeat_at, expires_at) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (member) DO UPDATE SET "
            "heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at, "
            "left_at = NULL",
            (member, now, now, now + ttl),
        )
        rows = conn.execute(
            f"SELECT member FROM {self.table} WHERE expires_at > %s AND left_at IS NULL "
            "ORDER BY member",
            (now,),
        ).fetchall()
        return [r[0] for r in rows]

    def leave(self, member: str, now: float) -> None:
        self._cursor().execute(
            f"UPDATE {self.table} SET left_at = %s, expires_at = %s WHERE member = %s",
            (now, now, member),
        )

    def rows(self) -> list[dict[str, Any]]:
        cur = self._cursor().execute(
            f"SELECT member, joined_at, heartbeat_at, expires_at, left_at FROM {self.table} "
            "ORDER BY member"
        )
        keys = ("member", "joined_at", "heartbeat_at", "expires_at", "left_at")
        return [dict(zip(keys, r, strict=True)) for r in cur.fetchall()]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def fair_share(partitions: int, live: int) -> int:
    return math.ceil(partitions / max(live, 1))


class Membership:
    """One member's view and its owned partitions (not thread-safe: one caller thread)."""

    def __init__(
        self,
        member: str,
        pmap: PartitionMap,
        parts: Mapping[int, OwnedPartition],
        members: Members,
        *,
        ttl: float = OWNERSHIP_TTL,
        tick_every: float = TICK_EVERY,
        say: Callable[[str], None] | None = None,
    ) -> None:
        if not ttl > tick_every > 0:
            raise ValueError(f"ownership ttl ({ttl}) must exceed the tick interval ({tick_every})")
        self.member = member
        self.pmap = pmap
        self.parts = parts
        self.members = members
        self.ttl = ttl
        self.tick_every = tick_every
        self.owned: dict[int, Owned] = {}
        self.live: list[str] = [member]
        self.last_now: float | None = None
        self._next_tick = -math.inf
        self._say = say or (lambda _m: None)
        self.left = False

    def fence(self, partition: int) -> Fence | None:
        o = self.owned.get(partition)
        return None if o is None else o.fence

    def drop(self, partition: int, why: str) -> None:
        """Forget a partition whose fence turned stale (someone else owns it now)."""
        if self.owned.pop(partition, None) is not None:
            self._say(f"{self.member} lost partition {partition}: {why}")

    def due(self, now: float) -> bool:
        return now >= self._next_tick

    def tick(self, now: float) -> None:
        if self.left:
            return
        self.last_now = now
        self._next_tick = now + self.tick_every
        try:
            self.live = self.members.heartbeat(self.member, now, self.ttl)
        except Exception as exc:
            self._say(f"{self.member}: membership server unreachable ({exc}); keeping view")
        if self.member not in self.live:
            self.live = sorted({*self.live, self.member})
        self._renew(now)
        share = fair_share(self.pmap.partitions, len(self.live))
        if len(self.owned) > share:
            self._release_surplus(now, len(self.owned) - share)
        elif len(self.owned) < share:
            self._acquire(now, share - len(self.owned))

    def _renew(self, now: float) -> None:
        for p, o in list(self.owned.items()):
            part = self.parts[p]
            try:
                part.renew_partition(o.fence, self.member, now, self.ttl)
            except StaleEpoch as exc:
                self.drop(p, str(exc))
                continue
            except FrontierError:
                continue  # server away: the fence check at the next grant decides
            self._log(part, o, now + self.ttl)

    def _log(self, part: OwnedPartition, o: Owned, expires_at: float) -> None:
        try:
            part.log_ownership(self.member, o.fence.epoch, o.acquired_at, expires_at)
        except FrontierError as exc:
            self._say(f"ownership log of partition {part.partition} not written: {exc}")

    def _order(self) -> list[int]:
        """This member's preference order over partitions (rendezvous hashing)."""
        return sorted(
            range(self.pmap.partitions), key=lambda p: stable_hash(f"{self.member}\x1f{p}")
        )

    def _release_surplus(self, now: float, n: int) -> None:
        # Keep the partitions this member prefers most; the others will prefer the rest.
        rank = {p: i for i, p in enumerate(self._order())}
        for p in sorted(self.owned, key=lambda q: rank[q], reverse=True)[:n]:
            self.release(p, now)

    def release(self, partition: int, now: float) -> None:
        """Hand a partition back: its ownership lease ends now, so the next owner may take it
        at once (with a new epoch); our own fence is stale from then on."""
        o = self.owned.pop(partition, None)
        if o is None:
            return
        part = self.parts[partition]
        try:
            part.renew_partition(o.fence, self.member, now, 0.0)
            part.log_ownership(self.member, o.fence.epoch, o.acquired_at, now)
            part.log_release(o.fence.epoch, now)
        except FrontierError as exc:  # StaleEpoch included: it was not ours any more
            self._say(f"{self.member}: releasing partition {partition}: {exc}")

    def _acquire(self, now: float, n: int) -> None:
        for p in self._order():
            if n <= 0:
                return
            if p in self.owned:
                continue
            part = self.parts[p]
            try:
                row = part.owner_row()
                if row is not None and row[0] not in (None, self.member) and row[2] > now:
                    continue  # held: do not even ask
                fence = part.acquire_partition(p, self.member, now, self.ttl)
            except PartitionBusy:
                continue
            except FrontierError:
                continue  # its server is away; try the others
            o = Owned(fence, now)
            self.owned[p] = o
            self._log(part, o, now + self.ttl)
            n -= 1

    def leave(self, now: float | None = None) -> None:
        """A clean stop: hand every partition back and leave the member list."""
        if self.left:
            return
        when = self.last_now if now is None else now
        if when is None:
            self.left = True
            return
        for p in list(self.owned):
            self.release(p, when)
        try:
            self.members.leave(self.member, when)
        except Exception as exc:
            self._say(f"{self.member}: could not mark leaving: {exc}")
        self.left = True
