"""``idemcrawl bench frontier --partitions P [--servers S]``: a partitioned frontier's grant rate
and what each grant costs its database servers.

Starts S throw-away PostgreSQL servers (``lab/pgserver.py``), makes a crawl of P partitions on
them (``db init``), seeds ``hosts`` x ``urls_per_host`` URLs (hosts spread over the partitions by
their hash) and drives one member, which owns every partition, through the
``PartitionedFrontier``: lease 256 at a time, complete each lease at once with 1 record and 10
new links on the same host (as ``bench frontier`` does), until ``completions`` are done.

Reported: grants/s and completions/s as the client sees them (time inside its lease and complete
calls), grants per partition, and the **server CPU** per 1,000 grants and per 1,000 completions:
every partition's backend CPU time (``dbcost.cpu_ns`` of its connection's server process) read
before and after each call, so each call's database work is attributed exactly. The servers'
background processes are not counted (they are shared by whatever runs on them).

What it is for: a partition is an ordinary PostgreSQL frontier and grants never cross partitions,
so the fleet's capacity is (servers x cores) / (server CPU per grant), provided each partition's
owner can reach its share; ``docs/partitioning.md`` turns the measured figures into the servers
and partitions needed for 25,000 grants/s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from idemcrawl.fleet.frontier import PartitionedFrontier, init_map
from idemcrawl.fleet.partition_map import PartitionMap, local_id
from idemcrawl.frontier.base import Completion, HostPolicy, Lease, NewURL, RecordWrite
from idemcrawl.lab.pgserver import PgServer

from . import dbcost

#: Leases asked for per lease call (the engine's group-commit batch).
BATCH = 256
LINKS_PER_PAGE = 10
_EPOCH = 1_000_000.0


@dataclass
class FleetBenchReport:
    partitions: int
    servers: int
    hosts: int
    grants: int
    completions: int
    lease_seconds: float
    complete_seconds: float
    grants_per_s: float
    completions_per_s: float
    min_grants_per_partition: int
    max_grants_per_partition: int
    server_cpu_ms_per_1000_grants: float | None
    server_cpu_ms_per_1000_completions: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        cpu_g = self.server_cpu_ms_per_1000_grants
        cpu_c = self.server_cpu_ms_per_1000_completions
        return (
            f"{self.partitions} partitions on {self.servers} server(s), {self.hosts} hosts: "
            f"{self.grants} grants at {self.grants_per_s:,.0f}/s, {self.completions} "
            f"completions at {self.completions_per_s:,.0f}/s; grants per partition "
            f"{self.min_grants_per_partition}..{self.max_grants_per_partition}; server CPU "
            f"{'n/a' if cpu_g is None else f'{cpu_g:,.0f}'} ms per 1,000 grants, "
            f"{'n/a' if cpu_c is None else f'{cpu_c:,.0f}'} ms per 1,000 completions"
        )


def _completions(leases: Sequence[Lease], now: float) -> list[Completion]:
    out = []
    for ls in leases:
        links = [
            NewURL(f"{ls.host_key}/n/{ls.url_id}/{k}", ls.host_key, depth=ls.depth + 1)
            for k in range(LINKS_PER_PAGE)
        ]
        rec = RecordWrite.make("bench", str(ls.url_id), {"url": ls.url, "n": 1})
        out.append(Completion(ls, 200, now, [rec], links, "h", 15_000))
    return out


class _BackendCpu:
    """CPU of every partition's server process, summed (None when not readable here)."""

    def __init__(self, f: PartitionedFrontier) -> None:
        self.f = f

    def read(self) -> int | None:
        total = 0
        for part in self.f.parts.values():
            pid = part.backend_pid
            ns = None if pid is None else dbcost.cpu_ns(pid)
            if ns is None:
                return None
            total += ns
        return total


def run_fleet_bench(
    partitions: int,
    servers: int,
    *,
    hosts: int = 1000,
    urls_per_host: int = 10,
    completions: int = 10_000,
) -> FleetBenchReport:
    if not 1 <= servers <= partitions:
        raise ValueError("--servers must be between 1 and --partitions")
    started = [PgServer().start() for _ in range(servers)]
    try:
        pmap = PartitionMap("bench", partitions, tuple(s.dsn for s in started))
        init_map(pmap)
        f = PartitionedFrontier(pmap, ttl=3600.0, tick_every=60.0)
        try:
            return _drive(f, pmap, hosts, urls_per_host, completions)
        finally:
            f.close()
    finally:
        for s in started:
            s.stop()


def _drive(
    f: PartitionedFrontier, pmap: PartitionMap, hosts: int, per_host: int, target: int
) -> FleetBenchReport:
    clock0 = time.monotonic()

    def now() -> float:
        return _EPOCH + time.monotonic() - clock0

    keys = [f"http://h{i}.bench" for i in range(hosts)]
    f.add([NewURL(f"{h}/p/{j}", h) for h in keys for j in range(per_host)], now())
    policy = HostPolicy(max_in_flight=1, delay=0.0)
    f.lease("bench", 0, now(), 60, policy)  # join: take every partition, untimed
    cpu = _BackendCpu(f)
    by_part = dict.fromkeys(range(pmap.partitions), 0)
    grants = done = 0
    t_lease = t_complete = 0.0
    cpu_lease = cpu_complete = 0
    cpu_ok = cpu.read() is not None
    while done < target:
        c0, t0 = cpu.read() if cpu_ok else None, time.perf_counter()
        leases = f.lease("bench", min(BATCH, target - done), now(), 60, policy)
        t1, c1 = time.perf_counter(), cpu.read() if cpu_ok else None
        if not leases:
            break
        ok = f.complete(_completions(leases, now()), now(), policy)
        t2, c2 = time.perf_counter(), cpu.read() if cpu_ok else None
        t_lease += t1 - t0
        t_complete += t2 - t1
        if c0 is not None and c1 is not None and c2 is not None:
            cpu_lease += c1 - c0
            cpu_complete += c2 - c1
        else:
            cpu_ok = False  # a backend was replaced (reconnect): no exact attribution
        grants += len(leases)
        done += sum(ok)
        for x in leases:
            by_part[local_id(x.url_id)[0]] += 1

    def per_1000(ns: int, n: int) -> float | None:
        return round(ns / 1e6 / n * 1000, 1) if cpu_ok and n else None

    return FleetBenchReport(
        partitions=pmap.partitions,
        servers=len(pmap.servers),
        hosts=hosts,
        grants=grants,
        completions=done,
        lease_seconds=round(t_lease, 3),
        complete_seconds=round(t_complete, 3),
        grants_per_s=round(grants / t_lease, 1) if t_lease else 0.0,
        completions_per_s=round(done / t_complete, 1) if t_complete else 0.0,
        min_grants_per_partition=min(by_part.values()),
        max_grants_per_partition=max(by_part.values()),
        server_cpu_ms_per_1000_grants=per_1000(cpu_lease, grants),
        server_cpu_ms_per_1000_completions=per_1000(cpu_complete, done),
    )
