"""Backends the shared contract suite runs against. A new backend adds one branch here.

Memory: a crawl named after the test's ``tmp_path``, so ``reopen`` gives a second handle on the
same rows (as a second process opens the same SQLite file); it is gone once every handle closed.

PostgreSQL: the server named by ``IDEMCRAWL_TEST_PG_DSN`` (default: the local test database).
Each test gets its own schema, named from its ``tmp_path`` plus a per-session salt (so a schema
left behind by a killed run is never reused), and the schema is dropped after the test. Tests
that need the server must never pass silently in CI: when ``CI`` is set and the server (or
psycopg) is missing they fail; only outside CI do they skip, with the reason.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemcrawl.frontier.base import Frontier, Inspection
from idemcrawl.frontier.memory import MemoryFrontier
from idemcrawl.frontier.sqlite import SQLiteFrontier

BACKENDS = ["sqlite", "postgres", "memory"]

PG_DSN = os.environ.get("IDEMCRAWL_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
_SESSION_SALT = uuid.uuid4().hex
_created_schemas: set[str] = set()
#: Whether this process ran a PostgreSQL test (``pytest_sessionfinish`` then vacuums).
_pg_used = False


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@functools.cache
def _pg_problem() -> str | None:
    """Why PostgreSQL tests cannot run here, or None when they can (checked once a session)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]>=3.1')"
    try:
        with psycopg.connect(PG_DSN, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL unreachable at {PG_DSN}: {exc}".strip()
    return None


def require_postgres() -> str:
    """The test DSN; fails the test in CI, skips it elsewhere, when PostgreSQL is unusable."""
    global _pg_used
    problem = _pg_problem()
    if problem is not None:
        if in_ci():
            pytest.fail(f"CI must run the PostgreSQL tests: {problem}", pytrace=False)
        pytest.skip(problem)
    _pg_used = True
    return PG_DSN


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Leave the server's catalogs as a session found them: VACUUM the catalogs this
    process's PostgreSQL tests churned (``CHURNED_CATALOGS``, as
    ``PostgresFrontier.vacuum_catalogs`` does); each xdist worker its own, as concurrent
    VACUUMs of one catalog queue. A failure is reported, never a test failure."""
    if not _pg_used:
        return
    import psycopg

    from idemcrawl.frontier.postgres import VACUUM_CATALOGS

    try:
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5) as conn:
            conn.execute(VACUUM_CATALOGS)
    except psycopg.Error as exc:
        print(f"\nidemcrawl tests: could not VACUUM the catalogs at {PG_DSN}: {exc}")


def pg_schema_for(tmp_path: Path) -> str:
    digest = hashlib.blake2b(f"{_SESSION_SALT}:{tmp_path}".encode(), digest_size=10).hexdigest()
    return f"t_{digest}"


def drop_pg_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    _created_schemas.discard(schema)


def queued_and_leased_by_host(
    frontier: Inspection,
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Each host's [queued, leased] URLs counted row by row, and the [queued, in_flight] its host
    row keeps (invariant I6 says they are equal)."""
    counted: dict[str, list[int]] = {}
    for row in frontier.url_rows():
        c = counted.setdefault(row["host_key"], [0, 0])
        c[0] += row["state"] == "queued"
        c[1] += row["state"] == "leased"
    kept = {h["host_key"]: [h["queued"], h["in_flight"]] for h in frontier.host_rows()}
    return counted, kept


def open_backend(name: str, tmp_path: Path, rng: random.Random | None = None) -> Frontier:
    """A handle on the test's crawl; ``rng`` seeds lease tokens and back-off jitter."""
    if name == "sqlite":
        return SQLiteFrontier(str(tmp_path / "crawl.db"), rng=rng)
    if name == "postgres":
        dsn = require_postgres()
        from idemcrawl.frontier.postgres import PostgresFrontier

        schema = pg_schema_for(tmp_path)
        _created_schemas.add(schema)
        return PostgresFrontier(dsn, schema=schema, rng=rng)
    if name == "memory":
        return MemoryFrontier(str(tmp_path), rng=rng)
    raise AssertionError(name)


@pytest.fixture(scope="session", autouse=True)
def _drop_leftover_pg_schemas() -> Iterator[None]:
    """Schemas opened through ``open_backend`` without the fixtures below are dropped here."""
    yield
    for schema in sorted(_created_schemas):
        drop_pg_schema(schema)


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def backend_store(backend_name: str, tmp_path: Path) -> Iterator[None]:
    """The crawl's storage; torn down after every handle on it (``frontier``, ``reopen``)."""
    yield
    if backend_name == "postgres" and pg_schema_for(tmp_path) in _created_schemas:
        drop_pg_schema(pg_schema_for(tmp_path))


@pytest.fixture
def frontier(backend_name: str, tmp_path: Path, backend_store: None) -> Iterator[Frontier]:
    f = open_backend(backend_name, tmp_path)
    yield f
    f.close()


@pytest.fixture
def reopen(backend_name: str, tmp_path: Path, backend_store: None):  # type: ignore[no-untyped-def]
    """Open a second handle on the same crawl (another process's view)."""
    opened: list[Frontier] = []

    def _open() -> Frontier:
        f = open_backend(backend_name, tmp_path)
        opened.append(f)
        return f

    yield _open
    for f in opened:
        f.close()
