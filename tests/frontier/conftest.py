"""Backends the shared contract suite runs against. A new backend adds one branch here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from idemcrawl.frontier.base import Frontier
from idemcrawl.frontier.sqlite import SQLiteFrontier

BACKENDS = ["sqlite"]


def open_backend(name: str, tmp_path: Path) -> Frontier:
    if name == "sqlite":
        return SQLiteFrontier(str(tmp_path / "crawl.db"))
    raise AssertionError(name)


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def frontier(backend_name: str, tmp_path: Path) -> Iterator[Frontier]:
    f = open_backend(backend_name, tmp_path)
    yield f
    f.close()


@pytest.fixture
def reopen(backend_name: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Open a second handle on the same crawl (another process's view)."""
    opened: list[Frontier] = []

    def _open() -> Frontier:
        f = open_backend(backend_name, tmp_path)
        opened.append(f)
        return f

    yield _open
    for f in opened:
        f.close()
