"""PostgreSQL servers a test starts and stops itself (issue 15: a fleet's partitions live on
several servers): fresh clusters on loopback ports, reachable, stoppable, restartable."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from idemcrawl.frontier.base import HostPolicy, NewURL
from idemcrawl.frontier.postgres import PostgresFrontier
from idemcrawl.lab.pgserver import PgServer, PgServerError, find_bin_dir

from ..frontier.conftest import in_ci

T0 = 1_000_000.0


@pytest.fixture
def pg_servers() -> Iterator[Callable[[int], list[PgServer]]]:
    """``start(n)`` starts n fresh servers; all are stopped and removed after the test."""
    if find_bin_dir() is None:
        if in_ci():
            pytest.fail("CI must run the fleet tests: no PostgreSQL server binaries", pytrace=False)
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    started: list[PgServer] = []

    def start(n: int) -> list[PgServer]:
        servers = [PgServer().start() for _ in range(n)]
        started.extend(servers)
        return servers

    yield start
    for server in started:
        server.stop()


@pytest.mark.slow
def test_servers_start_on_their_own_ports_and_vanish(
    pg_servers: Callable[[int], list[PgServer]],
) -> None:
    servers = pg_servers(3)
    assert len({s.port for s in servers}) == 3
    for i, s in enumerate(servers):
        with psycopg.connect(s.dsn) as conn:
            conn.execute("CREATE TABLE mark (n int)")
            conn.execute("INSERT INTO mark VALUES (%s)", (i,))
    for i, s in enumerate(servers):  # separate clusters: each holds only its own row
        with psycopg.connect(s.dsn) as conn:
            assert conn.execute("SELECT n FROM mark").fetchall() == [(i,)]
    root = servers[0].root
    assert root is not None and root.exists()
    servers[0].stop()
    assert not root.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(servers[0].dsn, connect_timeout=2)


@pytest.mark.slow
def test_a_frontier_rides_out_its_server_stopping_and_starting(
    pg_servers: Callable[[int], list[PgServer]],
) -> None:
    (server,) = pg_servers(1)
    f = PostgresFrontier(server.dsn, retry_seconds=30)
    failed: list[BaseException] = []

    def resume() -> None:
        try:
            server.resume()
        except BaseException as exc:
            failed.append(exc)

    # The timer is joined before the fixture stops the server: the frontier may connect
    # before ``pg_ctl start -w`` has seen the server ready, and a stop in between made that
    # pg_ctl report "could not start server" from the thread (a warning in one CI run).
    timer = threading.Timer(1.5, resume)
    try:
        f.add([NewURL(f"http://a/p{i}", "http://a") for i in range(3)], T0)
        server.pause()  # the server is down for a while ...
        timer.start()
        t = time.monotonic()
        leases = f.lease("w", 3, T0, 60, HostPolicy(max_in_flight=3, delay=0.0))
        # ... and the call waited for it instead of failing: no work lost, none doubled.
        assert time.monotonic() - t >= 1.0
        assert len(leases) == 3 and f.progress(T0).leased == 3
    finally:
        if timer.ident is not None:  # started
            timer.join()
        f.close()
    assert failed == [], "the server came back"


def test_missing_binaries_are_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(PgServerError, match="initdb"):
        PgServer(bin_dir=tmp_path).start()  # type: ignore[arg-type]
