"""``idemcrawl sim --fleet``: many members over many partitions, in virtual time.

What it shows (issue 15's acceptance): with members that crash and rejoin, pause past their
ownership TTL and wake up, and join late, (1) every partition has at most one owner at every
moment (the ownership log's terms never overlap), (2) every grant is made by the partition's
live owner under its current epoch (zero double grants: a stale or expired owner grants
nothing), and (3) a dead member's partitions are owned again within the TTL (plus one
membership tick) of its last renewal.

``--one-seed`` (issue 36) starts from ONE URL instead of a frontier seeded in every partition:
each page links to pages of hosts in other partitions, which reach their partition only
through the source partition's outbox, drained by its owner at each membership tick (as
``PartitionedFrontier.forward`` does). With ``--servers S --server-crashes N`` the partitions
live on S servers and N times a server is down for ``--server-downtime`` s: every call to its
partitions (leases, completions, ownership, deliveries into and out of them, the heartbeat
table on server 0) fails meanwhile, and what was committed stays. Then (4) every page reachable
from the seed is done, each completed exactly once, with no outbox row left.

The members run the real :class:`~idemcrawl.fleet.membership.Membership` (heartbeats, fair
share, rebalancing, takeover); each partition is a :class:`~idemcrawl.frontier.MemoryFrontier`
(the same scheduler and fencing code as PostgreSQL, in memory); the heartbeat table and the
ownership log are kept in memory here. One step of the loop is ``STEP`` virtual seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from idemcrawl.fleet.membership import Membership
from idemcrawl.fleet.partition_map import PartitionMap
from idemcrawl.frontier.base import (
    Completion,
    Fence,
    FrontierError,
    HostPolicy,
    Lease,
    NewURL,
    StaleEpoch,
)
from idemcrawl.frontier.memory import MemoryFrontier

STEP = 0.5
T0 = 1_000_000.0


class SimServer:
    """A database server of the simulation: down between a crash and its restart."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.down = False

    def check(self, partition: int | None = None) -> None:
        if self.down:
            where = "" if partition is None else f"partition {partition}: "
            raise FrontierError(f"{where}server {self.index} is down")


class SimPartition:
    """A partition for the simulation: a memory frontier, its ownership log and its outbox
    (links for other partitions, written with the completion that found them)."""

    def __init__(self, partition: int, server: SimServer | None = None) -> None:
        self.partition = partition
        self.server = server or SimServer(0)
        self.frontier = MemoryFrontier(rng=random.Random(partition))
        self.log: dict[int, dict[str, Any]] = {}
        self.row: tuple[str | None, int, float] | None = None
        self.outbox: list[tuple[int, NewURL]] = []

    def up(self) -> None:
        self.server.check(self.partition)

    def acquire_partition(self, partition: int, owner: str, now: float, ttl: float) -> Fence:
        self.up()
        fence = self.frontier.acquire_partition(partition, owner, now, ttl)
        self.row = (owner, fence.epoch, now + ttl)
        return fence

    def renew_partition(self, fence: Fence, owner: str, now: float, ttl: float) -> None:
        self.up()
        self.frontier.renew_partition(fence, owner, now, ttl)
        self.row = (owner, fence.epoch, now + ttl)

    def owner_row(self) -> tuple[str | None, int, float] | None:
        self.up()
        return self.row

    def log_ownership(self, owner: str, epoch: int, acquired_at: float, expires_at: float) -> None:
        self.up()
        term = self.log.setdefault(
            epoch,
            {"partition": self.partition, "epoch": epoch, "owner": owner,
             "acquired_at": acquired_at, "expires_at": expires_at, "released_at": None},
        )  # fmt: skip
        term["expires_at"] = max(term["expires_at"], expires_at)

    def log_release(self, epoch: int, released_at: float) -> None:
        self.up()
        if epoch in self.log:
            self.log[epoch]["released_at"] = released_at


class SimMembers:
    """The heartbeat table in memory (on server 0, as the real one is on the first server)."""

    def __init__(self, server: SimServer | None = None) -> None:
        self.expires: dict[str, float] = {}
        self.server = server or SimServer(0)

    def heartbeat(self, member: str, now: float, ttl: float) -> list[str]:
        self.server.check()
        self.expires[member] = now + ttl
        return sorted(m for m, t in self.expires.items() if t > now)

    def leave(self, member: str, now: float) -> None:
        self.server.check()
        self.expires[member] = now


@dataclass
class FleetSimOptions:
    members: int = 64
    partitions: int = 256
    hosts_per_partition: int = 4
    #: Enough work to last the whole run, so stale owners wake up to partitions with work.
    urls_per_host: int = 60
    fetch_seconds: tuple[float, float] = (1.0, 6.0)
    seconds: float = 900.0
    ttl: float = 15.0
    tick_every: float = 2.0
    crashes: int = 12
    downtime: float = 60.0
    pauses: int = 4
    late_joiners: int = 4
    in_flight: int = 4
    lease_seconds: float = 30.0
    seed: int = 1
    #: Start from one URL and discover the rest through links across partitions.
    one_seed: bool = False
    servers: int = 1
    server_crashes: int = 0
    server_downtime: float = 30.0

    def __post_init__(self) -> None:
        if self.members < 1 or self.partitions < 1:
            raise ValueError("--members and --partitions must be at least 1")
        if not 1 <= self.servers <= self.partitions:
            raise ValueError("--servers must be between 1 and --partitions")
        if self.server_crashes < 0 or self.server_downtime < 0:
            raise ValueError("--server-crashes and --server-downtime must be >= 0")
        if not self.ttl > self.tick_every > 0:
            raise ValueError("--ttl must exceed --tick")
        if self.crashes + self.pauses + self.late_joiners > self.members:
            raise ValueError("more crashes, pauses and late joiners than members")


@dataclass
class _Member:
    name: str
    membership: Membership | None = None
    alive: bool = False
    paused_until: float = 0.0
    incarnation: int = 0
    pending: list[tuple[float, Lease, int]] = field(default_factory=list)


@dataclass
class FleetSimReport:
    options: dict[str, Any]
    grants: int
    completed: int
    urls: int
    stale_refusals: int
    double_grants: int
    overlapping_terms: int
    takeovers: int
    max_reown_after_expiry_s: float | None
    max_reown_after_crash_s: float | None
    unowned_at_end: int
    #: ``--one-seed``: pages reachable from the seed, those done at the end, pages completed
    #: more than once, and outbox rows not delivered.
    reachable: int | None = None
    done_at_end: int | None = None
    completed_twice: int | None = None
    outbox_left: int | None = None
    server_crashes_done: int = 0

    @property
    def ok(self) -> bool:
        discovered = self.reachable is None or (
            self.done_at_end == self.reachable
            and self.completed_twice == 0
            and self.outbox_left == 0
        )
        return (
            self.double_grants == 0
            and self.overlapping_terms == 0
            and self.unowned_at_end == 0
            and (self.max_reown_after_expiry_s or 0.0) <= self.options["tick_every"] + STEP
            and discovered
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


class _Web:
    """The ``--one-seed`` site: host ``k`` lives in partition ``k mod P`` (so neighbouring
    hosts are in different partitions); its page 0 links to its own pages and to the page 0
    of hosts ``2k+1`` and ``2k+2`` (every host is reached in ~log2(hosts) cross-partition
    hops), and its page ``i`` to page ``i`` of host ``k+1`` (links that are mostly known
    already, so forwarding's insert-if-absent is exercised)."""

    def __init__(self, partitions: int, hosts: int, pages: int) -> None:
        self.partitions, self.hosts, self.pages = partitions, hosts, pages

    @staticmethod
    def url(k: int, i: int) -> NewURL:
        return NewURL(f"http://h{k}.sim/{i}", f"http://h{k}.sim")

    @staticmethod
    def where(url: str) -> tuple[int, int]:
        host, _, page = url.removeprefix("http://h").partition(".sim/")
        return int(host), int(page)

    def links(self, url: str) -> list[tuple[int, NewURL]]:
        k, i = self.where(url)
        if i == 0:
            out = [(k, j) for j in range(1, self.pages)]
            out += [(c, 0) for c in (2 * k + 1, 2 * k + 2) if c < self.hosts]
        else:
            out = [((k + 1) % self.hosts, i)]
        return [(c % self.partitions, self.url(c, j)) for c, j in out]


def run_fleet_sim(opts: FleetSimOptions) -> FleetSimReport:
    rng = random.Random(opts.seed)
    pmap = PartitionMap("sim", opts.partitions, ("postgresql://sim/0",))
    servers = [SimServer(i) for i in range(opts.servers)]
    parts = {p: SimPartition(p, servers[p % opts.servers]) for p in range(opts.partitions)}
    policy = HostPolicy(max_in_flight=1, delay=0.0)
    n_urls = 0
    web: _Web | None = None
    if opts.one_seed:
        hosts = opts.partitions * opts.hosts_per_partition
        web = _Web(opts.partitions, hosts, opts.urls_per_host)
        n_urls = hosts * opts.urls_per_host
        parts[0].frontier.add([web.url(0, 0)], T0)
    else:
        for p, part in parts.items():
            urls = [
                NewURL(f"http://p{p}h{h}.sim/{i}", f"http://p{p}h{h}.sim")
                for h in range(opts.hosts_per_partition)
                for i in range(opts.urls_per_host)
            ]
            n_urls += part.frontier.add(urls, T0)
    table = SimMembers(servers[0])
    members = [_Member(f"m{i:03d}") for i in range(opts.members)]
    # The schedule: late joiners start at a third of the run, everyone else at once; crashes
    # (and their restarts) and pauses land in the middle of the run.
    late = set(rng.sample(range(opts.members), opts.late_joiners))
    others = [i for i in range(opts.members) if i not in late]
    crash_who = rng.sample(others, opts.crashes)
    pause_who = rng.sample([i for i in others if i not in crash_who], opts.pauses)
    span = (opts.seconds * 0.2, opts.seconds * 0.6)
    crash_at = {i: T0 + rng.uniform(*span) for i in crash_who}
    pause_at = {i: T0 + rng.uniform(*span) for i in pause_who}
    join_at = {i: T0 + (opts.seconds / 3 if i in late else rng.uniform(0, 2)) for i in others}
    join_at.update({i: T0 + opts.seconds / 3 for i in late})
    # Server outages: (when, server, down?) in time order; overlapping ones on one server
    # keep it down until the last restart.
    outages: list[tuple[float, int, int]] = []
    windows: dict[int, list[tuple[float, float]]] = {}
    for _ in range(opts.server_crashes):
        at, srv = T0 + rng.uniform(*span), rng.randrange(opts.servers)
        outages += [(at, srv, 1), (at + opts.server_downtime, srv, -1)]
        windows.setdefault(srv, []).append((at, at + opts.server_downtime))
    outages.sort()

    def reachable_from(partition: int, t: float) -> float:
        """When partition's server could next be asked at or after ``t``: a term that
        expired while its server was down cannot be taken over before the server is back."""
        for start_, end_ in sorted(windows.get(partition % opts.servers, [])):
            if start_ <= t < end_:
                t = end_
        return t

    down_count = [0] * opts.servers
    restart_at: dict[int, float] = {}
    crash_times: list[tuple[str, float]] = []
    grants = completed = stale = double = 0
    completions_of: dict[str, int] = {}

    def start(i: int, now: float) -> None:
        m = members[i]
        m.incarnation += 1
        name = f"{m.name}#{m.incarnation}"  # a restarted process is a new member
        m.membership = Membership(
            name, pmap, parts, table, ttl=opts.ttl, tick_every=opts.tick_every
        )
        m.alive, m.pending = True, []

    def up(p: int) -> bool:
        return not parts[p].server.down

    def finish(lease: Lease, p: int, now: float) -> None:
        """Commit a fetched page: its own partition's links with it, the others' into its
        outbox in the same step (one transaction in the real partition)."""
        nonlocal completed
        found = [] if web is None else web.links(lease.url)
        local = [u for q, u in found if q == p]
        ok = parts[p].frontier.complete([Completion(lease, 200, now, links=local)], now, policy)
        if ok[0]:
            completed += 1
            completions_of[lease.url] = completions_of.get(lease.url, 0) + 1
            parts[p].outbox += [(q, u) for q, u in found if q != p]

    def forward(p: int, now: float) -> None:
        """The owner drains its partition's outbox: insert-if-absent into each target that
        is up; rows for a target that is down wait (as ``PartitionedFrontier.forward``)."""
        part = parts[p]
        if not part.outbox or not up(p):
            return
        by_target: dict[int, list[NewURL]] = {}
        kept: list[tuple[int, NewURL]] = []
        for q, u in part.outbox:
            if up(q):
                by_target.setdefault(q, []).append(u)
            else:
                kept.append((q, u))
        for q, urls in by_target.items():
            parts[q].frontier.add(urls, now)
        part.outbox = kept

    def lease_and_complete(m: _Member, now: float) -> None:
        nonlocal grants, stale, double
        ms = m.membership
        assert ms is not None
        done = [x for x in m.pending if x[0] <= now]
        m.pending = [x for x in m.pending if x[0] > now]
        for x in done:
            if up(x[2]):
                finish(x[1], x[2], now)
            else:  # the crawl waits for the server (up to a minute) and commits then
                m.pending.append(x)
        want = opts.in_flight - len(m.pending)
        for p in sorted(ms.owned):
            if want <= 0:
                break
            if not up(p):
                continue
            fence = ms.fence(p)
            assert fence is not None
            try:
                got = parts[p].frontier.lease(
                    ms.member, want, now, opts.lease_seconds, policy, fence
                )
            except StaleEpoch:
                stale += 1
                ms.drop(p, "stale")
                continue
            cur = parts[p].row
            if got and (cur is None or cur[:2] != (ms.member, fence.epoch) or cur[2] <= now):
                # Granted by a member that is not the partition's live owner at this moment:
                # the host's tokens could be granted twice (what fencing must prevent).
                double += len(got)
            grants += len(got)
            want -= len(got)
            m.pending += [(now + rng.uniform(*opts.fetch_seconds), x, p) for x in got]

    now = T0
    end = T0 + opts.seconds
    while now < end:
        while outages and outages[0][0] <= now:
            _, srv, delta = outages.pop(0)
            down_count[srv] += delta
            servers[srv].down = down_count[srv] > 0
        for i, m in enumerate(members):
            if not m.alive:
                if i in join_at and now >= join_at[i] and m.incarnation == 0:
                    start(i, now)
                elif i in restart_at and now >= restart_at[i]:
                    del restart_at[i]
                    start(i, now)
                continue
            if i in crash_at and now >= crash_at[i]:
                del crash_at[i]  # SIGKILL: no hand-back, in-flight work lost
                m.alive = False
                crash_times.append((f"{m.name}#{m.incarnation}", now))
                restart_at[i] = now + opts.downtime
                continue
            if i in pause_at and now >= pause_at[i]:
                del pause_at[i]
                m.paused_until = now + 2 * opts.ttl + opts.tick_every
            if now < m.paused_until:
                continue
            ms = m.membership
            assert ms is not None
            # A member that just woke up acts on its old beliefs first: the worst case.
            lease_and_complete(m, now)
            if ms.due(now):
                ms.tick(now)
                for p in sorted(ms.owned):
                    forward(p, now)
        now += STEP
    for srv in servers:
        srv.down = False
    for m in members:
        if m.alive and m.membership is not None:
            m.membership.tick(now)
    log = [t for part in parts.values() for t in part.log.values()]
    overlaps, takeovers, after_expiry, after_crash = check_terms(
        log, dict(crash_times), reachable_from
    )
    unowned = sum(
        1
        for part in parts.values()
        if part.row is None or part.row[2] <= now or part.row[0] is None
    )
    discovered: dict[str, int | None] = {}
    if web is not None:
        done_at_end = sum(
            part.frontier.stats().urls_by_state.get("done", 0) for part in parts.values()
        )
        discovered = {
            "reachable": n_urls,
            "done_at_end": done_at_end,
            "completed_twice": sum(1 for n in completions_of.values() if n > 1),
            "outbox_left": sum(len(part.outbox) for part in parts.values()),
        }
    return FleetSimReport(
        options=asdict(opts),
        grants=grants,
        completed=completed,
        urls=n_urls,
        stale_refusals=stale,
        double_grants=double,
        overlapping_terms=overlaps,
        takeovers=takeovers,
        max_reown_after_expiry_s=after_expiry,
        max_reown_after_crash_s=after_crash,
        unowned_at_end=unowned,
        server_crashes_done=opts.server_crashes,
        **discovered,  # type: ignore[arg-type]
    )


def check_terms(
    log: list[dict[str, Any]],
    crashed: dict[str, float],
    reachable_from: Callable[[int, float], float] = lambda _p, t: t,
) -> tuple[int, int, float | None, float | None]:
    """Overlapping terms, takeovers of a crashed member's partitions, and the worst delays
    from the dead term's expiry (or its server's return, when it expired during an outage)
    and from the crash to the next term."""
    by_part: dict[int, list[dict[str, Any]]] = {}
    for t in log:
        by_part.setdefault(t["partition"], []).append(t)
    overlaps = takeovers = 0
    after_expiry: list[float] = []
    after_crash: list[float] = []
    for terms in by_part.values():
        terms.sort(key=lambda t: t["epoch"])
        for a, b in itertools.pairwise(terms):
            end = a["expires_at"] if a["released_at"] is None else a["released_at"]
            if b["acquired_at"] < end:
                overlaps += 1
            if a["owner"] in crashed and a["released_at"] is None:
                takeovers += 1
                free = reachable_from(a["partition"], a["expires_at"])
                after_expiry.append(b["acquired_at"] - free)
                after_crash.append(b["acquired_at"] - crashed[a["owner"]])
    return (
        overlaps,
        takeovers,
        round(max(after_expiry), 3) if after_expiry else None,
        round(max(after_crash), 3) if after_crash else None,
    )


def _parser() -> argparse.ArgumentParser:
    d = FleetSimOptions()
    p = argparse.ArgumentParser(
        prog="idemcrawl sim --fleet",
        description="Members over partitions in virtual time with crashes, restarts, pauses "
        "past the ownership TTL and late joiners; checks single ownership, zero double grants "
        "and re-ownership within the TTL. Exit status 1 when a check fails.",
    )
    for name, help_ in (
        ("members", "crawl processes"),
        ("partitions", "partitions"),
        ("seconds", "virtual seconds to run"),
        ("ttl", "ownership and heartbeat TTL"),
        ("tick", "membership tick interval"),
        ("crashes", "members SIGKILLed (each restarts after --downtime)"),
        ("downtime", "seconds a crashed member stays down"),
        ("pauses", "members paused for 2 x TTL + a tick, then resumed"),
        ("late-joiners", "members that start a third into the run"),
        ("seed", "random seed"),
        ("servers", "database servers the partitions are spread over"),
        ("server-crashes", "times a server goes down (and comes back after --server-downtime)"),
        ("server-downtime", "seconds a crashed server stays down"),
        ("hosts-per-partition", "hosts per partition"),
        ("urls-per-host", "URLs per host"),
    ):
        dest = {"tick": "tick_every"}.get(name, name.replace("-", "_"))
        kind = int if isinstance(getattr(d, dest), int) else float
        p.add_argument(f"--{name}", dest=dest, type=kind, default=getattr(d, dest), help=help_)
    p.add_argument(
        "--one-seed",
        action="store_true",
        help="start from one URL; the rest is found through links across partitions",
    )
    p.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str]) -> int:
    a = vars(_parser().parse_args(argv))
    as_json = a.pop("json")
    report = run_fleet_sim(FleetSimOptions(**a))
    if as_json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        for k, v in report.as_dict().items():
            if k != "options":
                print(f"{k:28} {v}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
