"""`idemcrawl bench frontier`: how fast the frontier grants and completes, and what a URL costs.

The benchmark drives a frontier backend directly (no HTTP), with politeness on: one request in
flight per host, so a grant really runs the two-level schedule and the host token update. Each
completion carries one record and 10 newly discovered links (on the same host), as a real page
would, so completions/s includes the set-based insert-if-absent of its links and the event.

Reported: URLs added/s, lease grants/s, completions/s, bytes on disk per known URL, and the peak
RSS of the benchmark process.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from idemcrawl.frontier import open_frontier
from idemcrawl.frontier.base import Completion, Frontier, HostPolicy, NewURL, RecordWrite


@dataclass(frozen=True)
class FrontierBenchOptions:
    db: str = "sqlite"
    hosts: int = 1000
    urls_per_host: int = 20
    #: Completions to measure (default: one per seeded URL).
    completions: int | None = None
    lease_batch: int = 256
    links_per_page: int = 10


@dataclass
class FrontierBenchReport:
    backend: str
    hosts: int
    seeded_urls: int
    add_per_s: float
    grants: int
    grants_per_s: float
    completions: int
    completions_per_s: float
    known_urls: int
    bytes_on_disk: int
    bytes_per_url: float
    peak_rss_mb: float
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        return (
            f"backend {self.backend}: {self.hosts} hosts, {self.seeded_urls} seeded URLs\n"
            f"  add              {self.add_per_s:,.0f} URLs/s\n"
            f"  lease grants     {self.grants_per_s:,.0f}/s ({self.grants} grants, 1 in flight "
            "per host)\n"
            f"  completions      {self.completions_per_s:,.0f}/s ({self.completions}, each with "
            "1 record + 10 new links + 1 event)\n"
            f"  on disk          {self.bytes_per_url:,.0f} bytes per known URL "
            f"({self.known_urls} URLs, {self.bytes_on_disk / 1e6:,.1f} MB)\n"
            f"  peak RSS         {self.peak_rss_mb:,.0f} MB; wall {self.wall_s:.1f} s"
        )


_cleanups: list[Callable[[], None]] = []


def _drop(dsn: str, schema: str) -> None:
    from idemcrawl.frontier.postgres import PostgresFrontier

    pg = PostgresFrontier(dsn, schema=schema)
    pg.drop_schema()
    pg.close()


def _open(db: str, tmp: str) -> tuple[Frontier, str, Callable[[], int]]:
    if db == "sqlite":
        path = os.path.join(tmp, "bench.db")
        frontier = open_frontier(path)

        def size() -> int:
            return sum(
                os.path.getsize(path + suffix)
                for suffix in ("", "-wal")
                if os.path.exists(path + suffix)
            )

        return frontier, "sqlite", size
    if db.startswith(("postgresql://", "postgres://")):
        from idemcrawl.frontier.postgres import PostgresFrontier

        schema = "bench_" + uuid.uuid4().hex[:10]
        pg = PostgresFrontier(db, schema=schema)
        _cleanups.append(lambda: _drop(db, schema))

        def pg_size() -> int:
            return pg.schema_bytes()

        return pg, "postgresql", pg_size
    if db.startswith("memory:"):
        # Nothing on disk: its cost is the process's memory (peak RSS).
        return open_frontier(db), "memory", lambda: 0
    raise ValueError(f"--db must be 'sqlite', 'memory:' or a postgresql:// URL, got {db!r}")


def run_frontier_bench(
    opts: FrontierBenchOptions, log: Callable[[str], None] = lambda s: None
) -> FrontierBenchReport:
    policy = HostPolicy(max_in_flight=1, delay=0.0)
    with tempfile.TemporaryDirectory(prefix="idemcrawl-bench-") as tmp:
        frontier, backend, size = _open(opts.db, tmp)
        t_start = time.perf_counter()
        try:
            now = 1_000_000.0
            host_keys = [f"http://h{h:06d}.bench.invalid" for h in range(opts.hosts)]
            seeded = opts.hosts * opts.urls_per_host
            t = time.perf_counter()
            chunk: list[NewURL] = []
            for i in range(opts.urls_per_host):
                for hk in host_keys:
                    chunk.append(NewURL(f"{hk}/p/{i}", hk))
                    if len(chunk) >= 20_000:
                        frontier.add(chunk, now)
                        chunk = []
            if chunk:
                frontier.add(chunk, now)
            add_s = time.perf_counter() - t
            log(f"added {seeded} URLs in {add_s:.1f} s")

            target = opts.completions or seeded
            grants = completions = 0
            lease_s = complete_s = 0.0
            while completions < target:
                now += 0.001
                t = time.perf_counter()
                leases = frontier.lease("bench", opts.lease_batch, now, 600, policy)
                lease_s += time.perf_counter() - t
                if not leases:
                    break
                grants += len(leases)
                batch = []
                for ls in leases:
                    links = [
                        NewURL(f"{ls.host_key}/n/{ls.url_id}/{k}", ls.host_key, depth=ls.depth + 1)
                        for k in range(opts.links_per_page)
                    ]
                    rec = RecordWrite.make("bench", str(ls.url_id), {"url": ls.url, "n": 1})
                    batch.append(Completion(ls, 200, now, [rec], links, "h", 15_000))
                t = time.perf_counter()
                frontier.complete(batch, now, policy)
                complete_s += time.perf_counter() - t
                completions += len(batch)
                if completions % 20_000 < opts.lease_batch:
                    log(f"{completions} completions")
            known = sum(frontier.stats().urls_by_state.values())
            on_disk = size()
        finally:
            frontier.close()
            while _cleanups:
                _cleanups.pop()()
        wall = time.perf_counter() - t_start
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return FrontierBenchReport(
        backend=backend,
        hosts=opts.hosts,
        seeded_urls=seeded,
        add_per_s=seeded / add_s if add_s else 0.0,
        grants=grants,
        grants_per_s=grants / lease_s if lease_s else 0.0,
        completions=completions,
        completions_per_s=completions / complete_s if complete_s else 0.0,
        known_urls=known,
        bytes_on_disk=on_disk,
        bytes_per_url=on_disk / known if known else 0.0,
        peak_rss_mb=rss_mb,
        wall_s=wall,
    )
