"""Fixtures of the engine tests: the real SQLite frontier on a temporary file, a virtual clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from idemcrawl.frontier.base import HostPolicy, Lease, NewURL
from idemcrawl.frontier.sqlite import SQLiteFrontier

from .fakes import FakeClock

HOST = "http://shop.test"


@pytest.fixture
def frontier(tmp_path: Path) -> Iterator[SQLiteFrontier]:
    f = SQLiteFrontier(str(tmp_path / "crawl.db"))
    yield f
    f.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def add_pages(f: SQLiteFrontier, clock: FakeClock, n: int, host: str = HOST) -> list[str]:
    urls = [f"{host}/p{i}" for i in range(n)]
    f.add([NewURL(u, host) for u in urls], clock.time())
    f.add_seeds([host])
    return urls


def lease_all(
    f: SQLiteFrontier, clock: FakeClock, n: int, *, lease_seconds: float = 60.0
) -> list[Lease]:
    """Lease ``n`` URLs at once, politeness aside (the pipeline tests need leases, not policy)."""
    return f.lease("test/0", n, clock.time(), lease_seconds, HostPolicy(max_in_flight=n, delay=0))
