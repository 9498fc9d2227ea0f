"""When a process with nothing granted should look again (``Progress.next_ready_at``), and
``requeue_deferred`` lifting a robots.txt error so a rerun does not wait out its TTL (#18)."""

from __future__ import annotations

import itertools

import pytest

from idemcrawl.frontier.base import (
    Completion,
    Failure,
    Frontier,
    HostPolicy,
    NewURL,
    RobotsFetch,
)
from idemcrawl.robots import RobotsCache, RobotsSettings

T0 = 1_000_000.0
POLITE = HostPolicy(max_in_flight=1, delay=1.0)


def test_next_ready_is_when_a_host_can_really_be_granted(frontier: Frontier) -> None:
    frontier.add([NewURL(f"http://a/p{i}", "http://a") for i in range(3)], T0)
    (ls,) = frontier.lease("w", 5, T0, 30, POLITE)
    # The host's one slot is taken: its slot comes back with the lease, not at a time.
    p = frontier.progress(T0, POLITE.max_in_flight)
    assert p.next_ready_at is None and p.next_due_at == T0
    assert frontier.complete([Completion(ls, 200, T0 + 0.1)], T0 + 0.1, POLITE) == [True]
    p = frontier.progress(T0 + 0.2, POLITE.max_in_flight)
    # URLs due since T0, but the host's timer runs until T0 + 1.1: that is the moment.
    assert p.next_due_at == T0
    assert p.next_ready_at == T0 + 1.1
    assert frontier.lease("w", 5, T0 + 0.2, 30, POLITE) == []
    assert len(frontier.lease("w", 5, T0 + 1.1, 30, POLITE)) == 1


def test_next_ready_waits_for_the_first_due_url_and_skips_paused_hosts(
    frontier: Frontier,
) -> None:
    frontier.add([NewURL("http://b/x", "http://b")], T0)
    (ls,) = frontier.lease("w", 5, T0, 30, POLITE)
    retry = Failure(ls, "HTTP 503", retry_at=T0 + 30, status=503)
    assert frontier.fail([retry], T0, POLITE) == [True]
    # Timer and back-off aside, nothing is due before the retry.
    assert frontier.progress(T0 + 5, POLITE.max_in_flight).next_ready_at == T0 + 30
    frontier.add([NewURL("http://c/y", "http://c")], T0 + 5)
    assert frontier.progress(T0 + 5, POLITE.max_in_flight).next_ready_at == T0 + 5
    frontier.control("pause", "http://c")
    assert frontier.progress(T0 + 5, POLITE.max_in_flight).next_ready_at == T0 + 30
    frontier.control("pause")
    assert frontier.progress(T0 + 5, POLITE.max_in_flight).next_ready_at is None
    # Without the allowance the old fields alone are reported.
    assert frontier.progress(T0 + 5).next_ready_at is None


def test_next_ready_pages_past_many_hosts(frontier: Frontier) -> None:
    hosts = [f"http://h{i:03d}" for i in range(150)]
    frontier.add([NewURL(f"{h}/x", h) for h in hosts], T0)
    leases = frontier.lease("w", 500, T0, 30, POLITE)
    assert len(leases) == 150
    # Every host retries later; the last one in timer order is the soonest.
    failures = [
        Failure(ls, "HTTP 503", retry_at=T0 + 100 - i * 0.5, status=503)
        for i, ls in enumerate(sorted(leases, key=lambda ls: ls.host_key))
    ]
    assert all(frontier.fail(failures, T0, POLITE))
    assert frontier.progress(T0 + 2, POLITE.max_in_flight).next_ready_at == T0 + 100 - 149 * 0.5


def test_retry_deferred_lifts_the_robots_error(frontier: Frontier) -> None:
    settings = RobotsSettings(error_ttl=3600.0)
    policy = HostPolicy(max_in_flight=1, delay=0.0, robots=RobotsCache(settings))
    frontier.add([NewURL("http://r/p", "http://r")], T0)
    (robots,) = frontier.lease("w", 5, T0, 30, policy)
    assert robots.url == "http://r/robots.txt"
    answer = Completion(robots, 500, T0 + 0.1, robots=RobotsFetch(500, b"", "HTTP 500"))
    assert frontier.complete([answer], T0 + 0.1, policy) == [True]
    # Unreachable: disallow all, and the host rests for the error TTL.
    assert frontier.lease("w", 5, T0 + 1, 30, policy) == []
    assert frontier.progress(T0 + 1, 1).next_ready_at >= T0 + 3600
    frontier.requeue_deferred()
    host = frontier.host_row("http://r")
    assert host is not None and host["robots_failures"] == 0 and host["backoff_until"] == 0
    # robots.txt is asked for again at once, not an hour later.
    (again,) = frontier.lease("w", 5, T0 + 2, 30, policy)
    assert again.url == "http://r/robots.txt" and again.version == robots.version + 1


def test_adaptive_gap_grants_promise_spaced_starts(frontier: Frontier) -> None:
    """Spacing that is only the adaptive gap: several grants per call, starts one gap apart
    (I6), the lease log records those starts, and the audit finds no violation."""
    from idemcrawl.frontier.scheduler import SCHEDULE_AHEAD

    policy = HostPolicy(max_in_flight=8, delay=0.0, latency_factor=2.0)
    frontier.add([NewURL(f"http://f/p{i}", "http://f") for i in range(30)], T0)
    (first,) = frontier.lease("w", 1, T0, 30, policy)
    # 10 ms answers: the gap becomes 2 * 0.010 / 8 = 2.5 ms.
    done = Completion(first, 200, T0 + 0.01, latency=0.010)
    assert frontier.complete([done], T0 + 0.01, policy) == [True]
    leases = frontier.lease("w", 20, T0 + 0.02, 30, policy)
    assert len(leases) == 8  # the allowance, all within SCHEDULE_AHEAD
    starts = [ls.start_at or T0 + 0.02 for ls in leases]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(g == pytest.approx(0.0025) for g in gaps)
    assert starts[-1] - starts[0] <= SCHEDULE_AHEAD
    host = frontier.host_row("http://f")
    assert host is not None and host["next_allowed_at"] == pytest.approx(starts[-1] + 0.0025)
    assert frontier.lease_audit()["violations"] == 0
    # A configured delay (I8 spaces response ends too): one start per grant, as before.
    fixed = HostPolicy(max_in_flight=8, delay=0.001, latency_factor=2.0)
    frontier.add([NewURL(f"http://g/p{i}", "http://g") for i in range(5)], T0)
    assert len(frontier.lease("w", 5, T0 + 1, 30, fixed)) == 1
