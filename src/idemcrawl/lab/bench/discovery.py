"""`idemcrawl bench discovery`: links/s through discovery, with and without the Bloom filter.

Each discovered link goes through what a crawled page's links go through: normalisation against
the page URL, the scope check, the stateless trap checks, then the template-growth gate, which
must know whether the URL is *new*. With the Bloom filter, "definitely new" is answered in
memory and only "maybe known" links cost a database look-up; without it, every link of a batch is
looked up in the frontier's durable unique key. Both variants then insert-if-absent into a real
SQLite frontier in batches, as page completions do.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from idemcrawl import url as urls
from idemcrawl.discovery import DiscoveryGate
from idemcrawl.frontier.base import PAGE, QUEUED, REJECTED, NewURL
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.traps import TrapLimits, check_url


@dataclass
class DiscoveryBenchReport:
    links: int
    repeat_fraction: float
    with_bloom_per_s: float
    without_bloom_per_s: float
    lookups_with_bloom: int
    lookups_without_bloom: int
    inserted: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        saved = self.lookups_without_bloom - self.lookups_with_bloom
        return (
            f"{self.links:,} links ({self.repeat_fraction:.0%} repeats) through normalise → "
            "scope → trap checks → template gate → insert-if-absent (SQLite)\n"
            f"  with Bloom filter     {self.with_bloom_per_s:,.0f} links/s, "
            f"{self.lookups_with_bloom:,} durable-key look-ups\n"
            f"  without Bloom filter  {self.without_bloom_per_s:,.0f} links/s, "
            f"{self.lookups_without_bloom:,} durable-key look-ups\n"
            f"  look-ups saved        {saved:,} "
            f"({saved / max(self.lookups_without_bloom, 1):.0%}); {self.inserted:,} URLs stored"
        )


def _links(n: int, repeat_fraction: float, seed: int) -> list[tuple[str, str]]:
    """(href, page URL) pairs: relative, root-relative and absolute links over 200 hosts."""
    rng = random.Random(seed)
    distinct = int(n * (1 - repeat_fraction))
    out: list[tuple[str, str]] = []
    for i in range(n):
        k = i if i < distinct else rng.randrange(distinct)
        host = f"h{k % 200}.bench.test"
        page = f"http://{host}/section/{k % 97}/index.html"
        form = k % 3
        if form == 0:
            href = f"item-{k}.html?ref={k % 7}"
        elif form == 1:
            href = f"/catalog/{k // 200}/item-{k}.html"
        else:
            href = f"http://{host}/p/{k}#top"
        out.append((href, page))
    rng.shuffle(out)
    return out


def _run(pairs: list[tuple[str, str]], use_bloom: bool, batch: int) -> tuple[float, int, int]:
    limits = TrapLimits(template_growth_limit=10**9)
    scope = frozenset(f"http://h{h}.bench.test" for h in range(200))
    with tempfile.TemporaryDirectory() as tmp:
        frontier = SQLiteFrontier(os.path.join(tmp, "d.db"))
        gate = DiscoveryGate(limits, expected_urls=len(pairs))
        lookups = 0
        t = time.perf_counter()
        pending: list[NewURL] = []
        for href, base in pairs:
            try:
                u = urls.normalise(href, base)
            except urls.InvalidURL:
                continue
            if not urls.in_scope(u, scope, "host") or check_url(u, 1, limits):
                continue
            pending.append(NewURL(u, urls.host_key(u), depth=1))
            if len(pending) >= batch:
                lookups += _commit(frontier, gate, pending, use_bloom)
                pending = []
        if pending:
            lookups += _commit(frontier, gate, pending, use_bloom)
        elapsed = time.perf_counter() - t
        inserted = sum(frontier.stats().urls_by_state.values())
        frontier.close()
    return elapsed, lookups, inserted


def _commit(frontier: SQLiteFrontier, gate: DiscoveryGate, links: list[NewURL], bloom: bool) -> int:
    if bloom:
        maybe = sum(1 for u in links if gate.bloom.might_contain(u.url))
        admitted, _ = gate.filter(links)
        frontier.add(admitted, 0.0)
        return maybe  # only "maybe known" links needed the durable key
    known = frontier.existing_urls([u.url for u in links])
    out = []
    for u in links:
        if u.url in known:
            out.append(u)
            continue
        known.add(u.url)
        ok, reason = gate.gate.admit(u.url)
        out.append(u if ok else NewURL(u.url, u.host_key, u.priority, u.depth, REJECTED, reason))
    frontier.add([u for u in out if u.kind == PAGE and u.state in (QUEUED, REJECTED)], 0.0)
    return len(links)


def run_discovery_bench(
    n: int = 1_000_000, repeat_fraction: float = 0.4, seed: int = 1, batch: int = 400
) -> DiscoveryBenchReport:
    pairs = _links(n, repeat_fraction, seed)
    t_with, look_with, inserted = _run(pairs, True, batch)
    t_without, look_without, _ = _run(pairs, False, batch)
    return DiscoveryBenchReport(
        links=n,
        repeat_fraction=repeat_fraction,
        with_bloom_per_s=n / t_with,
        without_bloom_per_s=n / t_without,
        lookups_with_bloom=look_with,
        lookups_without_bloom=look_without,
        inserted=inserted,
    )
