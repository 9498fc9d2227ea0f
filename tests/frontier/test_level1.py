"""Level 1 reads the ready hosts a lease call can use, in two windows (``Scheduler._ready_hosts``),
on every backend."""

from __future__ import annotations

from typing import Any

import pytest

from idemcrawl.frontier.base import Frontier, HostPolicy, NewURL
from idemcrawl.frontier.memory import MemoryStore
from idemcrawl.frontier.postgres_store import PgStore
from idemcrawl.frontier.scheduler import READY_REACH, READY_SLACK
from idemcrawl.frontier.sql import SQLStore

T0 = 1_000_000.0
ONE = HostPolicy(max_in_flight=1, delay=0.0)


def _spy_ready(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``limit`` of every level-1 read (SQLite's and PostgreSQL's stores, the memory one),
    whether alone (``ready_hosts``) or with the lease call's first checks
    (``first_ready_hosts``, when it read the window)."""
    limits: list[int] = []
    for cls in (SQLStore, PgStore, MemoryStore):
        real = cls.ready_hosts
        real_first = cls.first_ready_hosts

        def spy(self: Any, now: float, max_in_flight: int, limit: int, _real: Any = real) -> Any:
            limits.append(limit)
            return _real(self, now, max_in_flight, limit)

        def spy_first(
            self: Any, now: float, max_in_flight: int, limit: int, _real: Any = real_first
        ) -> Any:
            rows = _real(self, now, max_in_flight, limit)
            if rows is not None:
                limits.append(limit)
            return rows

        monkeypatch.setattr(cls, "ready_hosts", spy)
        monkeypatch.setattr(cls, "first_ready_hosts", spy_first)
    return limits


def test_a_call_reads_its_limit_of_ready_hosts_plus_the_slack(
    frontier: Frontier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 ready hosts, each taking one lease: the first window covers a call of 5; the hosts
    # beyond it are neither read nor (PostgreSQL) locked.
    frontier.add([NewURL(f"http://h{i:02d}/p", f"http://h{i:02d}") for i in range(40)], T0)
    limits = _spy_ready(monkeypatch)
    assert len(frontier.lease("w", 5, T0, 60, ONE)) == 5
    assert limits == [5 + READY_SLACK]


def test_hosts_that_take_nothing_are_passed_over_into_the_second_window(
    frontier: Frontier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two good hosts, served once so that their token (T0 + 1) puts them behind ten hosts
    # whose daily budget is 0: those fill the first window of a call of 2 and take nothing
    # (they are deferred); the second window reaches the good hosts.
    good = [f"http://good{i}" for i in range(2)]
    frontier.add([NewURL(f"{h}/{n}", h) for h in good for n in range(2)], T0)
    first = frontier.lease("w", 2, T0, 60, ONE)
    assert len(first) == 2
    frontier.complete([_done(ls, T0 + 1) for ls in first], T0 + 1, ONE)
    bad = [f"http://bad{i:02d}" for i in range(10)]
    frontier.add([NewURL(f"{h}/p", h) for h in bad], T0 + 1)
    for h in bad:
        frontier.control("set-budget", h, 0)
    limits = _spy_ready(monkeypatch)
    leases = frontier.lease("w", 2, T0 + 2, 60, ONE)
    assert sorted(ls.host_key for ls in leases) == good
    assert limits == [2 + READY_SLACK, READY_REACH * 2 + READY_SLACK]
    assert frontier.stats().urls_by_state["deferred"] == 10


def _done(ls: Any, now: float) -> Any:
    from idemcrawl.frontier.base import Completion

    return Completion(ls, 200, now, [], [], "h", 100)


def test_the_first_window_follows_the_urls_per_host_of_the_last_call(
    frontier: Frontier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 hosts of 10 URLs. A first call of 20 at 4 in flight per host reads 20 + SLACK hosts
    # and grants 4 URLs of each of 5; the next call of 20 reads only the 5 hosts it needs
    # plus the slack. When the hosts then take one URL each (a delay), the first window falls
    # short and the second reads on: the call still gets its 20, from the same hosts one
    # large window would give.
    keys = [f"http://h{h:02d}" for h in range(40)]
    frontier.add([NewURL(f"{k}/{n}", k) for k in keys for n in range(10)], T0)
    four = HostPolicy(max_in_flight=4, delay=0.0)
    limits = _spy_ready(monkeypatch)
    first = frontier.lease("w", 20, T0, 60, four)
    assert len(first) == 20 and len({ls.host_key for ls in first}) == 5
    assert limits == [20 + READY_SLACK]
    limits.clear()
    second = frontier.lease("w", 20, T0, 60, four)
    assert len(second) == 20 and len({ls.host_key for ls in second}) == 5
    assert limits == [5 + READY_SLACK]
    limits.clear()
    spaced = frontier.lease("w", 20, T0, 60, HostPolicy(max_in_flight=4, delay=5.0))
    hosts = [ls.host_key for ls in spaced]
    assert len(hosts) == len(set(hosts)) == 20
    assert not set(hosts) & {ls.host_key for ls in first + second}
    assert limits == [5 + READY_SLACK, READY_REACH * 20 + READY_SLACK]
