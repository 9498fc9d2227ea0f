"""Servers for the fleet tests: three throw-away PostgreSQL servers per module (starting one
costs ~1-3 s, so the tests of a module share them; each test makes its own crawl, a crawl name
of its own, on them)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from idemcrawl.fleet.frontier import PartitionedFrontier, init_map
from idemcrawl.fleet.partition_map import PartitionMap, make_map
from idemcrawl.lab.pgserver import PgServer, find_bin_dir

from ..frontier.conftest import in_ci

_names = itertools.count()


@pytest.fixture(scope="module")
def fleet_servers() -> Iterator[list[PgServer]]:
    if find_bin_dir() is None:
        if in_ci():
            pytest.fail("CI must run the fleet tests: no PostgreSQL server binaries", pytrace=False)
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    servers: list[PgServer] = []
    try:
        for _ in range(3):
            servers.append(PgServer().start())
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def new_crawl(
    fleet_servers: list[PgServer],
) -> Iterator[Callable[..., tuple[PartitionMap, PartitionedFrontier]]]:
    """``new_crawl(partitions, servers=3, **frontier_kw)``: a fresh partitioned crawl and a
    first handle on it (more handles: ``PartitionedFrontier(pmap)``); closed after the test."""
    opened: list[PartitionedFrontier] = []

    def make(
        partitions: int = 4, servers: int = 3, **kw: object
    ) -> tuple[PartitionMap, PartitionedFrontier]:
        pmap = make_map(f"c{next(_names)}", partitions, [s.dsn for s in fleet_servers[:servers]])
        init_map(pmap)
        f = PartitionedFrontier(pmap, **kw)  # type: ignore[arg-type]
        opened.append(f)
        return pmap, f

    yield make
    for f in opened:
        f.close()
