"""Property tests of the scheduler invariants (I3, I4, I6, I7, I8 of ``frontier.base``).

The contract tests pin single scenarios; these let hypothesis pick host configurations and
interleavings of add / lease / complete / fail / expire / duplicate deliveries that nobody would
write by hand, against every backend (``conftest.BACKENDS``), each on a fresh crawl per example.
A small model of what the frontier promised (live leases, grant times, releases, back-off) is
kept beside it, and every invariant is checked after every step, so a failure shrinks to the
shortest sequence of operations that breaks one. The frontier is observed only through its
contract and the inspection API every backend implements (``url_rows``, ``host_rows``,
``host_row``, ``url_row``: the stored rows as they are).
"""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from idemcrawl.frontier.base import (
    PAGE,
    ROBOTS,
    Completion,
    Failure,
    Frontier,
    HostPolicy,
    Lease,
    NewURL,
    RecordWrite,
    RobotsFetch,
)
from idemcrawl.politeness import allowance
from idemcrawl.robots import RobotsCache, RobotsSettings

from .conftest import BACKENDS, drop_pg_schema, open_backend, pg_schema_for, require_postgres

T0 = 1_000_000.0
LEASE_SECONDS = 10.0
EPS = 1e-9
HOSTS = [f"http://h{i}.test" for i in range(4)]

SETTINGS = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

#: Time steps: zero (same instant), sub-delay, about one delay, beyond a lease's expiry.
time_steps = st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0, 1.0, 2.5, LEASE_SECONDS + 1])


class FreshCrawl:
    """A new crawl on ``backend`` for one example, removed again in ``close``.

    Hypothesis replays a failing example to shrink it, so the frontier must behave the same
    every time: its generator (back-off jitter, lease tokens) is seeded.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._tmp = tempfile.TemporaryDirectory(prefix="idemcrawl-prop-")
        self.path = Path(self._tmp.name)
        self.frontier: Frontier = open_backend(backend, self.path, rng=random.Random(0))

    def close(self) -> None:
        self.frontier.close()
        if self.backend == "postgres":
            drop_pg_schema(pg_schema_for(self.path))
        self._tmp.cleanup()


@dataclass
class HostModel:
    """What the frontier promised about one host, from the outside."""

    delay: float
    max_in_flight: int
    last_grant: float | None = None
    last_release: float | None = None
    backoff_until: float = 0.0
    grants: int = 0


@dataclass
class Model:
    """Leases the frontier handed out and what became of them."""

    hosts: dict[str, HostModel]
    live: dict[int, Lease] = field(default_factory=dict)  # url_id -> lease not yet resolved
    old: list[Lease] = field(default_factory=list)  # resolved or reclaimed leases
    page_completions: int = 0


class SchedulerMachine(RuleBasedStateMachine):
    """Random interleavings of frontier operations; invariants checked after each step."""

    leases = Bundle("leases")
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.crawl = FreshCrawl(self.backend)
        self.f = self.crawl.frontier
        self.now = T0
        self.n_urls = 0
        self.policy = HostPolicy()
        self.model = Model({})

    def teardown(self) -> None:
        self.crawl.close()

    # -- set-up ---------------------------------------------------------------------------------

    @initialize(
        default_delay=st.sampled_from([0.0, 0.5, 1.0]),
        default_max=st.integers(1, 3),
        overrides=st.lists(
            st.one_of(
                st.none(),
                st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.integers(1, 3)),
            ),
            min_size=len(HOSTS),
            max_size=len(HOSTS),
        ),
    )
    def configure(
        self,
        default_delay: float,
        default_max: int,
        overrides: list[tuple[float, int] | None],
    ) -> None:
        self.policy = HostPolicy(max_in_flight=default_max, delay=default_delay, backoff_cap=5.0)
        for host, ov in zip(HOSTS, overrides, strict=True):
            if ov is None:
                self.model.hosts[host] = HostModel(default_delay, default_max)
            else:
                self.f.set_host_overrides(host, delay=ov[0], max_in_flight=ov[1])
                self.model.hosts[host] = HostModel(*ov)

    # -- operations -----------------------------------------------------------------------------

    @rule(host=st.sampled_from(HOSTS), n=st.integers(1, 4), priority=st.integers(0, 2))
    def add(self, host: str, n: int, priority: int) -> None:
        urls = [NewURL(f"{host}/p{self.n_urls + i}", host, priority=priority) for i in range(n)]
        self.n_urls += n
        assert self.f.add(urls, self.now) == n

    @rule(
        target=leases,
        n=st.integers(1, 6),
        dt=time_steps,
        paced=st.one_of(st.none(), st.integers(0, 3)),
    )
    def lease(self, n: int, dt: float, paced: int | None) -> Any:
        self.now += dt
        self._reclaim()
        allow_before = {h: self._allowance(h) for h in HOSTS}
        live_before = Counter(ls.host_key for ls in self.model.live.values())
        got = self.f.lease("w", n, self.now, LEASE_SECONDS, self.policy, paced=paced)
        assert len(got) <= n
        # A crawler's waiting workers bound the leases whose start is spaced by a gap.
        assert paced is None or sum(ls.paced for ls in got) <= paced
        per_host = Counter(ls.host_key for ls in got)
        for ls in got:
            assert ls.kind == PAGE
            assert ls.paced == (self.model.hosts[ls.host_key].delay > 0), ls
            # A URL is never leased twice at once (I3/I6).
            assert ls.url_id not in self.model.live, f"{ls.url} leased twice"
            self.model.live[ls.url_id] = ls
        for host, k in per_host.items():
            hm = self.model.hosts[host]
            # I6: a grant only while in_flight is below the allowance at grant time.
            assert live_before[host] + k <= allow_before[host], (host, live_before[host], k)
            if hm.delay > 0:
                assert k == 1, "with a delay, one start per grant"
            # Start spacing (I6), end-to-start spacing (I8), and back-off (R8).
            if hm.last_grant is not None:
                assert self.now >= hm.last_grant + hm.delay - EPS, (host, "start gap")
            if hm.last_release is not None:
                assert self.now >= hm.last_release + hm.delay - EPS, (host, "end-start gap")
            assert self.now >= hm.backoff_until - EPS, (host, "granted during back-off")
            hm.last_grant = self.now
            hm.grants += k
        return multiple(*got)

    @rule(ls=consumes(leases), dt=time_steps, records=st.integers(0, 2))
    def complete(self, ls: Lease, dt: float, records: int) -> None:
        self.now += dt
        recs = [RecordWrite.make("t", f"{ls.url}#{i}", {"i": i}) for i in range(records)]
        expect = self._should_accept(ls)
        snap = None if expect else self._snapshot()
        (ok,) = self.f.complete([Completion(ls, 200, self.now, recs)], self.now, self.policy)
        assert ok == expect, (ls.url, ok, expect)
        if ok:
            self._resolve(ls)
            self.model.page_completions += 1
        else:
            assert self._snapshot() == snap, "a rejected completion changed something"
        self.model.old.append(ls)

    @rule(
        ls=consumes(leases),
        dt=time_steps,
        host_error=st.booleans(),
        retry_in=st.one_of(st.none(), st.sampled_from([0.0, 1.0, 3.0])),
        retry_after=st.one_of(st.none(), st.sampled_from([0.5, 2.0])),
    )
    def fail(
        self,
        ls: Lease,
        dt: float,
        host_error: bool,
        retry_in: float | None,
        retry_after: float | None,
    ) -> None:
        self.now += dt
        expect = self._should_accept(ls)
        retry_at = None if retry_in is None else self.now + retry_in
        failure = Failure(
            ls,
            "boom",
            retry_at,
            503,
            host_error=host_error,
            retry_after=retry_after if host_error else None,
        )
        snap = None if expect else self._snapshot()
        (ok,) = self.f.fail([failure], self.now, self.policy)
        assert ok == expect
        if not ok:
            assert self._snapshot() == snap, "a rejected failure changed something"
        if ok:
            self._resolve(ls)
            row = self.f.host_row(ls.host_key)
            assert row is not None
            hm = self.model.hosts[ls.host_key]
            if host_error:
                assert row["error_streak"] >= 1
                if retry_after is not None:
                    assert row["backoff_until"] >= self.now + retry_after - EPS
            hm.backoff_until = max(hm.backoff_until, row["backoff_until"])
            url = self.f.url_row(ls.url)
            assert url is not None
            assert url["state"] == ("failed" if retry_at is None else "queued")
            if retry_at is not None:
                assert url["due_at"] >= retry_at - EPS
        self.model.old.append(ls)

    @precondition(lambda self: bool(self.model.old))
    @rule(data=st.data(), dt=time_steps)
    def duplicate_complete(self, data: st.DataObject, dt: float) -> None:
        """Deliver an old lease again: it must be rejected and change nothing (I3)."""
        self.now += dt
        ls = data.draw(st.sampled_from(self.model.old))
        if ls.url_id in self.model.live and self.model.live[ls.url_id].token == ls.token:
            return  # not old after all (cannot happen; kept for clarity)
        snap = self._snapshot()
        (ok,) = self.f.complete([Completion(ls, 200, self.now)], self.now, self.policy)
        assert ok is False
        assert self._snapshot() == snap

    @rule(dt=st.sampled_from([LEASE_SECONDS + 0.5, 2 * LEASE_SECONDS]))
    def expire(self, dt: float) -> None:
        """Time passes beyond the leases' expiry (the workers died); reclaim them (I7)."""
        self.now += dt
        expected = self._reclaim()
        assert self.f.expire(self.now) == expected

    # -- model helpers --------------------------------------------------------------------------

    def _allowance(self, host: str) -> int:
        row = self.f.host_row(host)
        streak = row["error_streak"] if row else 0
        return allowance(self.model.hosts[host].max_in_flight, streak)

    def _should_accept(self, ls: Lease) -> bool:
        live = self.model.live.get(ls.url_id)
        return live is not None and live.token == ls.token

    def _resolve(self, ls: Lease) -> None:
        del self.model.live[ls.url_id]
        self.model.hosts[ls.host_key].last_release = self.now

    def _reclaim(self) -> int:
        """Leases that the frontier's next lease()/expire() at ``now`` must take back."""
        gone = [u for u, ls in self.model.live.items() if ls.expires_at <= self.now]
        for u in gone:
            self.model.old.append(self.model.live.pop(u))
        return len(gone)

    def _snapshot(self) -> tuple[Any, ...]:
        """Everything a rejected completion or failure must leave as it was: every stored host
        and URL row, whole, and the counts of URLs by state, events and records."""
        s = self.f.stats()
        return s.urls_by_state, s.events, s.records, self.f.host_rows(), self.f.url_rows()

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def in_flight_matches_leases(self) -> None:
        urls = self.f.url_rows()
        leased = Counter(u["host_key"] for u in urls if u["state"] == "leased")
        queued = Counter(u["host_key"] for u in urls if u["state"] == "queued")
        for row in self.f.host_rows():
            host = row["host_key"]
            assert row["in_flight"] == leased[host], (host, row["in_flight"], leased[host])
            assert row["queued"] == queued[host], (host, row["queued"], queued[host])
            hm = self.model.hosts.get(host)
            if hm is not None:
                # Never above the configured maximum. (The allowance itself may drop below
                # in_flight after an error: requests already out are not recalled.)
                assert row["in_flight"] <= hm.max_in_flight
        live_by_host = Counter(ls.host_key for ls in self.model.live.values())
        # Leases past their expiry stay 'leased' until the next lease()/expire() reclaims them.
        for host in HOSTS:
            assert leased[host] == live_by_host[host], host

    @invariant()
    def events_match_completions(self) -> None:
        events = list(self.f.iter_events())
        rounds = Counter((e["url_id"], e["url_version"]) for e in events)
        assert all(n == 1 for n in rounds.values()), rounds
        assert len(events) == self.model.page_completions

    @invariant()
    def audit_is_clean(self) -> None:
        assert self.f.lease_audit()["violations"] == 0


def _run_machine(machine: type[RuleBasedStateMachine], backend: str) -> None:
    if backend == "postgres":
        require_postgres()  # fail in CI, skip elsewhere, before hypothesis starts
    run_state_machine_as_test(
        type(f"{machine.__name__}_{backend}", (machine,), {"backend": backend}),
        settings=SETTINGS,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_scheduler_invariants(backend: str) -> None:
    _run_machine(SchedulerMachine, backend)


# -- robots.txt gating --------------------------------------------------------------------------

ROBOTS_BODY = b"User-agent: *\nDisallow: /private\n"
ROBOTS_MAX_AGE = 20.0
ROBOTS_ERROR_TTL = 5.0


class RobotsMachine(RuleBasedStateMachine):
    """No page is leased before its host's robots.txt is known (and fresh), and no URL under
    a disallowed prefix is ever leased, whatever the order of fetches and completions."""

    leases = Bundle("leases")
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.crawl = FreshCrawl(self.backend)
        self.f = self.crawl.frontier
        settings_ = RobotsSettings(max_age=ROBOTS_MAX_AGE, error_ttl=ROBOTS_ERROR_TTL)
        self.policy = HostPolicy(
            max_in_flight=2, delay=0.0, robots=RobotsCache(settings_, max_entries=2)
        )
        self.now = T0
        self.n_urls = 0
        #: host -> (allows pages, valid until), as the completions we sent make it.
        self.robots: dict[str, tuple[bool, float]] = {}
        self.private_added: set[str] = set()

    def teardown(self) -> None:
        self.crawl.close()

    @rule(host=st.sampled_from(HOSTS), n=st.integers(1, 4), private=st.booleans())
    def add(self, host: str, n: int, private: bool) -> None:
        prefix = "/private/" if private else "/pub/"
        urls = [NewURL(f"{host}{prefix}p{self.n_urls + i}", host) for i in range(n)]
        self.n_urls += n
        self.f.add(urls, self.now)
        if private:
            self.private_added.update(u.url for u in urls)

    @rule(target=leases, n=st.integers(1, 6), dt=time_steps)
    def lease(self, n: int, dt: float) -> Any:
        self.now += dt
        got = self.f.lease("w", n, self.now, LEASE_SECONDS, self.policy)
        for ls in got:
            if ls.kind == ROBOTS:
                continue
            known = self.robots.get(ls.host_key)
            assert known is not None, f"{ls.url} leased before robots.txt was known"
            allows, until = known
            assert allows, f"{ls.url} leased while robots.txt was unreachable"
            assert self.now < until, f"{ls.url} leased on an expired robots.txt copy"
            assert "/private/" not in ls.url, f"{ls.url} is disallowed"
        return multiple(*got)

    @rule(ls=consumes(leases), dt=time_steps, status=st.sampled_from([200, 200, 200, 500]))
    def complete(self, ls: Lease, dt: float, status: int) -> None:
        self.now += dt
        if ls.kind == ROBOTS:
            fetch = RobotsFetch(200, ROBOTS_BODY) if status == 200 else RobotsFetch(500)
            c = Completion(ls, status, self.now, robots=fetch)
            (ok,) = self.f.complete([c], self.now, self.policy)
            if ok:
                prev = self.robots.get(ls.host_key)
                if status == 200:
                    self.robots[ls.host_key] = (True, self.now + ROBOTS_MAX_AGE)
                else:  # unreachable: keep a good copy if there is one, retry after the TTL
                    allows = prev is not None and prev[0]
                    self.robots[ls.host_key] = (allows, self.now + ROBOTS_ERROR_TTL)
        else:
            self.f.complete([Completion(ls, 200, self.now)], self.now, self.policy)

    @invariant()
    def private_urls_never_fetched(self) -> None:
        for url in self.private_added:
            row = self.f.url_row(url)
            assert row is not None
            assert row["state"] in ("queued", "disallowed", "deferred"), (url, row["state"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_robots_gating(backend: str) -> None:
    _run_machine(RobotsMachine, backend)


# -- regression ---------------------------------------------------------------------------------


def test_stale_failure_changes_no_host_state(frontier: Frontier) -> None:
    """A late Failure for a lease that already completed must not back the host off (I3).
    (fail() used to count the host error before checking the lease fence.)"""
    f = frontier
    policy = HostPolicy(max_in_flight=1, delay=0.0)
    f.add([NewURL("http://a.test/p0", "http://a.test")], T0)
    (ls,) = f.lease("w", 1, T0, LEASE_SECONDS, policy)
    assert f.complete([Completion(ls, 200, T0 + 1)], T0 + 1, policy) == [True]
    before = f.host_row("http://a.test")
    late = Failure(ls, "late 503", T0 + 5, 503, host_error=True, retry_after=120.0)
    assert f.fail([late], T0 + 2, policy) == [False]
    assert f.host_row("http://a.test") == before
    assert "host_backoffs" not in f.stats().counters
