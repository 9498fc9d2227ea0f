"""In-memory backend specifics: what ``memory:`` names share, and how handles end. The contract
itself is checked by the shared suites (``BACKENDS`` includes ``memory``)."""

from __future__ import annotations

import random

import pytest

from idemcrawl.frontier import MemoryFrontier, open_frontier
from idemcrawl.frontier.base import FrontierError, HostPolicy, NewURL
from idemcrawl.frontier.store import SCHEMA_VERSION

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=8, delay=0.0)


def test_named_crawls_are_shared_private_ones_are_not() -> None:
    a, b = open_frontier("memory:shop"), open_frontier("memory:shop")
    private = open_frontier("memory:")
    a.add([NewURL("http://a/1", "http://a")], T0)
    assert b.stats().urls_by_state["queued"] == 1
    assert private.stats().urls_by_state["queued"] == 0
    assert isinstance(a, MemoryFrontier) and a.migrate() == SCHEMA_VERSION
    for f in (a, b, private):
        f.close()


def test_a_named_crawl_lives_while_a_handle_is_open() -> None:
    with pytest.raises(FrontierError, match="no in-memory crawl"):
        open_frontier("memory:gone", create=False)
    first = open_frontier("memory:gone")
    first.add([NewURL("http://a/1", "http://a")], T0)
    second = open_frontier("memory:gone", create=False)
    first.close()
    first.close()  # closing twice is harmless
    assert second.stats().urls_by_state["queued"] == 1
    second.close()  # the last handle: the crawl is gone (not durable)
    with pytest.raises(FrontierError, match="no in-memory crawl"):
        open_frontier("memory:gone", create=False)
    with pytest.raises(FrontierError, match="closed"):
        second.stats()


def test_seeded_rng_makes_runs_repeat() -> None:
    def run() -> list[tuple[str, int]]:
        f = MemoryFrontier(rng=random.Random(7))
        f.add([NewURL(f"http://h{i}/p", f"http://h{i}") for i in range(5)], T0)
        leases = f.lease("w", 5, T0, 30, FAST)
        f.close()
        return [(ls.url, ls.token) for ls in leases]

    assert run() == run()


def test_a_lease_costs_about_what_it_grants_not_the_frontier_size() -> None:
    """The indexes keep a lease about as cheap on a large frontier as on a small one."""
    import time

    def lease_seconds(hosts: int, per_host: int) -> float:
        f = MemoryFrontier(rng=random.Random(1))
        f.add([NewURL(f"http://h{h}/p{i}", f"http://h{h}") for i in range(per_host) for h in
               range(hosts)], T0)  # fmt: skip
        f.lease("w", 100, T0, 30, FAST)  # files every host in the ready index once
        t = time.perf_counter()
        for k in range(1, 41):
            assert len(f.lease("w", 100, T0 + k, 30, FAST)) == 100
        took = time.perf_counter() - t
        f.close()
        return took

    small, large = lease_seconds(1_000, 4), lease_seconds(10_000, 20)  # 50x the URLs
    assert large < small * 5, (small, large)
