"""The frontier contract (invariants I1-I8 of ``idemcrawl.frontier.base``), for every backend."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from idemcrawl.frontier.base import (
    Completion,
    Failure,
    Frontier,
    HostPolicy,
    NewURL,
    RecordWrite,
    record_id,
)

from .conftest import queued_and_leased_by_host

T0 = 1_000_000.0
FAST = HostPolicy(max_in_flight=8, delay=0.0)
POLITE = HostPolicy(max_in_flight=1, delay=1.0)


def urls(host: str, n: int, start: int = 0) -> list[NewURL]:
    return [NewURL(f"{host}/p{i}", host) for i in range(start, start + n)]


def test_add_known_url_is_noop(frontier: Frontier) -> None:
    assert frontier.add(urls("http://a", 3), T0) == 3
    leases = frontier.lease("w", 1, T0, 30, FAST)
    assert frontier.add(urls("http://a", 5), T0 + 1) == 2
    # Re-adding the leased URL did not reset it to queued.
    assert frontier.stats().urls_by_state["leased"] == 1
    assert frontier.add([NewURL(leases[0].url, "http://a", priority=9)], T0) == 0


def test_lease_carries_version_and_expiry(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 1), T0)
    (lease,) = frontier.lease("w", 10, T0, 30, FAST)
    assert lease.version == 1
    assert lease.expires_at == T0 + 30
    assert lease.owner == "w"
    assert frontier.lease("w", 10, T0, 30, FAST) == []


def test_complete_writes_everything_in_one_step(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 1), T0)
    (lease,) = frontier.lease("w", 1, T0, 30, FAST)
    rec = RecordWrite.make("shop", "SKU-1", {"price": "1.00"})
    links = [*urls("http://a", 3, start=1), NewURL("http://b/x", "http://b")]
    ok = frontier.complete([Completion(lease, 200, T0 + 1, [rec], links, "h1", 10)], T0 + 1, FAST)
    assert ok == [True]
    s = frontier.stats()
    assert s.urls_by_state["done"] == 1
    assert s.urls_by_state["queued"] == 4
    assert s.records == 1
    assert s.events == 1
    assert s.counters.get("fetches") == 1
    (row,) = list(frontier.records())
    assert row["record_id"] == record_id("shop", "SKU-1")
    assert json.loads(row["data"]) == {"price": "1.00"}
    assert row["url"] == lease.url


def test_duplicate_and_stale_completion_change_nothing(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 1), T0)
    (lease,) = frontier.lease("w", 1, T0, 30, FAST)
    rec = RecordWrite.make("s", "k", {"v": 1})
    c = Completion(lease, 200, T0, [rec], urls("http://a", 2, start=1))
    assert frontier.complete([c], T0, FAST) == [True]
    before = frontier.stats()
    c2 = Completion(lease, 200, T0, [RecordWrite.make("s", "k", {"v": 2})], urls("http://z", 2))
    assert frontier.complete([c2], T0 + 1, FAST) == [False]
    after = frontier.stats()
    assert after.events == before.events == 1
    assert after.urls_by_state == before.urls_by_state
    assert json.loads(next(iter(frontier.records()))["data"]) == {"v": 1}


def test_expired_lease_cannot_complete_and_url_is_retried(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 1), T0)
    (old,) = frontier.lease("dead", 1, T0, 10, FAST)
    assert frontier.lease("w", 1, T0 + 5, 10, FAST) == []  # still leased
    (new,) = frontier.lease("w", 1, T0 + 11, 10, FAST)  # expired, re-leased
    assert new.url_id == old.url_id and new.token != old.token
    assert frontier.complete([Completion(old, 200, T0 + 12)], T0 + 12, FAST) == [False]
    assert frontier.complete([Completion(new, 200, T0 + 12)], T0 + 12, FAST) == [True]
    s = frontier.stats()
    assert s.events == 1
    assert s.counters["lease_expiries"] == 1


def test_expire_returns_url_and_host_slot(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 2), T0)
    assert len(frontier.lease("dead", 5, T0, 10, POLITE)) == 1
    assert frontier.progress(T0).leased == 1
    assert frontier.expire(T0 + 10) == 1
    p = frontier.progress(T0 + 10)
    assert (p.queued, p.leased) == (2, 0)
    assert len(frontier.lease("w", 5, T0 + 10, 10, POLITE)) == 1


def test_release_owner_requeues_only_that_owner(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 1) + urls("http://b", 1), T0)
    frontier.lease("one", 1, T0, 60, FAST)
    frontier.lease("two", 1, T0, 60, FAST)
    assert frontier.release_owner("one") == 1
    p = frontier.progress(T0)
    assert (p.queued, p.leased) == (1, 1)


def test_record_upsert_keeps_first_seen_and_tracks_changes(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 3), T0)
    leases = frontier.lease("w", 3, T0, 30, FAST)
    same = {"price": "5.00"}
    frontier.complete(
        [Completion(leases[0], 200, T0, [RecordWrite.make("s", "k", same)])], T0, FAST
    )
    frontier.complete(
        [Completion(leases[1], 200, T0 + 5, [RecordWrite.make("s", "k", dict(same))])], T0 + 5, FAST
    )
    (row,) = list(frontier.records())
    assert (row["first_seen"], row["last_changed"]) == (T0, T0)
    frontier.complete(
        [Completion(leases[2], 200, T0 + 9, [RecordWrite.make("s", "k", {"price": "6.00"})])],
        T0 + 9,
        FAST,
    )
    (row,) = list(frontier.records())
    assert (row["first_seen"], row["last_changed"]) == (T0, T0 + 9)
    assert json.loads(row["data"]) == {"price": "6.00"}


def test_politeness_one_in_flight_and_delay(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 5), T0)
    (first,) = frontier.lease("w", 10, T0, 30, POLITE)
    assert frontier.lease("w", 10, T0 + 5, 30, POLITE) == []  # slot busy
    frontier.complete([Completion(first, 200, T0 + 5)], T0 + 5, POLITE)
    assert frontier.lease("w", 10, T0 + 5.5, 30, POLITE) == []  # delay after completion
    assert len(frontier.lease("w", 10, T0 + 6, 30, POLITE)) == 1


def test_delay_spaces_starts_even_with_free_slots(frontier: Frontier) -> None:
    policy = HostPolicy(max_in_flight=4, delay=2.0)
    frontier.add(urls("http://a", 5), T0)
    assert len(frontier.lease("w", 10, T0, 30, policy)) == 1
    assert frontier.lease("w", 10, T0 + 1.9, 30, policy) == []
    assert len(frontier.lease("w", 10, T0 + 2.0, 30, policy)) == 1


def test_paced_bounds_only_the_leases_of_hosts_spaced_by_a_gap(frontier: Frontier) -> None:
    """``lease(paced=k)``: at most k leases of hosts with a gap between starts (marked
    ``paced``, for a crawler's waiting workers), any number of the others (which may wait in
    a crawler's hands): a host with a delay is left ready, not skipped for good."""
    policy = HostPolicy(max_in_flight=4, delay=0.0)
    frontier.set_host_overrides("http://slow", delay=1.0, max_in_flight=None)
    frontier.add(urls("http://slow", 5) + urls("http://fast", 10), T0)
    ahead = frontier.lease("w", 10, T0, 30, policy, paced=0)
    assert [ls.host_key for ls in ahead] == ["http://fast"] * 4
    assert not any(ls.paced for ls in ahead)
    (slow,) = frontier.lease("w", 10, T0, 30, policy, paced=1)
    assert slow.host_key == "http://slow" and slow.paced
    # Without the bound: as ever, the delay gives one start per grant.
    assert frontier.lease("w", 10, T0 + 0.5, 30, policy) == []
    (again,) = frontier.lease("w", 10, T0 + 1.0, 30, policy)
    assert again.host_key == "http://slow" and again.paced


def test_a_robots_lease_is_paced_when_its_host_has_a_delay(frontier: Frontier) -> None:
    from idemcrawl.robots import RobotsCache, RobotsSettings

    policy = HostPolicy(max_in_flight=4, delay=0.0, robots=RobotsCache(RobotsSettings()))
    frontier.set_host_overrides("http://r", delay=1.0, max_in_flight=None)
    frontier.add(urls("http://r", 3) + urls("http://q", 3), T0)
    (free,) = frontier.lease("w", 10, T0, 30, policy, paced=0)
    assert (free.kind, free.host_key, free.paced) == ("robots", "http://q", False)
    (spaced,) = frontier.lease("w", 10, T0, 30, policy, paced=1)
    assert (spaced.kind, spaced.host_key, spaced.paced) == ("robots", "http://r", True)


def test_hosts_are_scheduled_independently(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 50) + urls("http://b", 1) + urls("http://c", 1), T0)
    hosts = {lease.host_key for lease in frontier.lease("w", 10, T0, 30, POLITE)}
    assert hosts == {"http://a", "http://b", "http://c"}


def test_priority_orders_urls_within_host(frontier: Frontier) -> None:
    frontier.add(
        [
            NewURL("http://a/low", "http://a", priority=0),
            NewURL("http://a/high", "http://a", priority=5),
        ],
        T0,
    )
    (lease,) = frontier.lease("w", 1, T0, 30, POLITE)
    assert lease.url == "http://a/high"


def test_fail_retries_then_gives_up(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 1), T0)
    (lease,) = frontier.lease("w", 1, T0, 30, FAST)
    assert frontier.fail([Failure(lease, "timeout", retry_at=T0 + 60)], T0, FAST) == [True]
    assert frontier.lease("w", 1, T0 + 30, 30, FAST) == []  # not due yet
    (again,) = frontier.lease("w", 1, T0 + 60, 30, FAST)
    assert again.attempts == 1
    assert frontier.fail([Failure(again, "timeout", retry_at=None)], T0 + 61, FAST) == [True]
    s = frontier.stats()
    assert s.urls_by_state["failed"] == 1
    assert frontier.progress(T0 + 61).finished
    assert frontier.fail([Failure(again, "late", retry_at=None)], T0 + 62, FAST) == [False]


def test_terminal_rejections_are_recorded_not_leased(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/x", "http://a", state="out_of_scope", reason="scope")], T0)
    assert frontier.lease("w", 5, T0, 30, FAST) == []
    assert frontier.progress(T0).finished
    assert frontier.stats().urls_by_state["out_of_scope"] == 1


def test_progress_reports_wait_for_foreign_leases(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 1), T0)
    frontier.lease("dead", 1, T0, 30, FAST)
    p = frontier.progress(T0 + 1)
    assert not p.finished
    assert p.next_lease_expiry == T0 + 30


def test_batch_completion_accepts_each_independently(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 2), T0)
    a, b = frontier.lease("w", 2, T0, 30, FAST)
    frontier.complete([Completion(a, 200, T0)], T0, FAST)
    res = frontier.complete([Completion(a, 200, T0), Completion(b, 200, T0)], T0, FAST)
    assert res == [False, True]
    assert frontier.stats().events == 2


def test_state_is_shared_between_handles(frontier: Frontier, reopen) -> None:  # type: ignore[no-untyped-def]
    other = reopen()
    frontier.add(urls("http://a", 1), T0)
    (lease,) = other.lease("w2", 5, T0, 30, POLITE)
    assert frontier.lease("w1", 5, T0 + 2, 30, POLITE) == []
    assert frontier.complete([Completion(lease, 200, T0)], T0, POLITE) == [True]
    assert other.stats().events == 1


def test_concurrent_leasers_never_exceed_allowance(frontier: Frontier, reopen) -> None:  # type: ignore[no-untyped-def]
    handles = [reopen() for _ in range(4)]
    frontier.add(urls("http://a", 40) + urls("http://b", 40), T0)
    policy = HostPolicy(max_in_flight=2, delay=0.0)
    got: list = []
    lock = threading.Lock()

    def worker(h: Frontier, name: str) -> None:
        for _ in range(20):
            leases = h.lease(name, 3, T0, 30, policy)
            with lock:
                got.extend(leases)

    threads = [threading.Thread(target=worker, args=(h, f"w{i}")) for i, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_host: dict[str, int] = {}
    for lease in got:
        per_host[lease.host_key] = per_host.get(lease.host_key, 0) + 1
    assert per_host == {"http://a": 2, "http://b": 2}


def test_meta_and_seeds(frontier: Frontier) -> None:
    assert frontier.get_meta("x") is None
    frontier.set_meta("x", "1")
    frontier.set_meta("x", "2")
    assert frontier.get_meta("x") == "2"
    frontier.add_seeds(["http://a", "http://b"])
    frontier.add_seeds(["http://a"])
    assert frontier.seed_hosts() == frozenset({"http://a", "http://b"})


def test_partition_fencing_rejects_a_stale_owner(frontier: Frontier) -> None:
    from idemcrawl.frontier.base import PartitionBusy, StaleEpoch

    frontier.add(urls("http://a", 3), T0)
    fence_a = frontier.acquire_partition(0, "A", T0, ttl=10)
    assert fence_a.epoch == 1
    assert len(frontier.lease("A", 1, T0, 30, FAST, fence=fence_a)) == 1
    with pytest.raises(PartitionBusy):
        frontier.acquire_partition(0, "B", T0 + 5, ttl=10)
    # A pauses past its ownership lease; B takes over with a higher epoch.
    fence_b = frontier.acquire_partition(0, "B", T0 + 11, ttl=10)
    assert fence_b.epoch == 2
    queued_before = frontier.progress(T0 + 12).queued
    with pytest.raises(StaleEpoch):
        frontier.lease("A", 5, T0 + 12, 30, FAST, fence=fence_a)
    with pytest.raises(StaleEpoch):
        frontier.renew_partition(fence_a, "A", T0 + 12, ttl=10)
    assert frontier.progress(T0 + 12).queued == queued_before  # the stale grant granted nothing
    assert len(frontier.lease("B", 5, T0 + 12, 30, FAST, fence=fence_b)) == 2
    frontier.renew_partition(fence_b, "B", T0 + 15, ttl=10)
    assert frontier.acquire_partition(0, "B", T0 + 16, ttl=10) == fence_b  # renewal keeps epoch
    # Once B's ownership lapses, its fence is refused too.
    with pytest.raises(StaleEpoch):
        frontier.lease("B", 1, T0 + 40, 30, FAST, fence=fence_b)


def test_partitions_are_independent(frontier: Frontier) -> None:
    f0 = frontier.acquire_partition(0, "A", T0, ttl=10)
    f1 = frontier.acquire_partition(1, "B", T0, ttl=10)
    assert (f0.epoch, f1.epoch) == (1, 1)
    frontier.renew_partition(f0, "A", T0 + 1, ttl=10)
    frontier.renew_partition(f1, "B", T0 + 1, ttl=10)


def test_robots_refusals_never_lease_a_url_twice(frontier: Frontier) -> None:
    from idemcrawl.frontier.base import RobotsFetch
    from idemcrawl.robots import RobotsCache, RobotsSettings

    policy = HostPolicy(max_in_flight=8, delay=0.0, robots=RobotsCache(RobotsSettings()))
    batch = [
        NewURL(f"http://a/{p}", "http://a", priority=pr)
        for p, pr in (("a", 9), ("private/1", 8), ("private/2", 7), ("b", 1))
    ]
    frontier.add(batch, T0)
    (robots,) = frontier.lease("w", 8, T0, 30, policy)
    assert robots.url == "http://a/robots.txt"
    body = b"User-agent: *\nDisallow: /private\n"
    frontier.complete([Completion(robots, 200, T0, robots=RobotsFetch(200, body))], T0, policy)
    leases = frontier.lease("w", 8, T0 + 1, 30, policy)
    assert sorted(lease.url for lease in leases) == ["http://a/a", "http://a/b"]
    assert frontier.stats().urls_by_state["disallowed"] == 2


def _counting_robots_policy(checked: list[str]) -> HostPolicy:
    """A policy (8 in flight per host, no delay) whose robots.txt cache appends every URL it
    is asked about to ``checked``."""
    from idemcrawl.robots import RobotsCache, RobotsSettings

    class Counting(RobotsCache):
        def allowed(self, *args: Any, **kwargs: Any) -> bool:
            checked.append(args[-1])
            return super().allowed(*args, **kwargs)

    return HostPolicy(max_in_flight=8, delay=0.0, robots=Counting(RobotsSettings()))


def test_robots_checks_only_what_a_lease_needs(frontier: Frontier) -> None:
    """Level 2 walks past any number of refused URLs in one lease call, and checks no URL it
    will not grant: the refused ones become ``disallowed``, the rest stay queued unchecked."""
    from idemcrawl.frontier.base import RobotsFetch

    checked: list[str] = []
    policy = _counting_robots_policy(checked)
    batch = [NewURL(f"http://a/private/{i}", "http://a", priority=9) for i in range(40)]
    batch += [NewURL(f"http://a/open/{i}", "http://a", priority=1) for i in range(30)]
    frontier.add(batch, T0)
    (robots,) = frontier.lease("w", 8, T0, 30, policy)
    body = b"User-agent: *\nDisallow: /private\n"
    frontier.complete([Completion(robots, 200, T0, robots=RobotsFetch(200, body))], T0, policy)
    checked.clear()
    (lease,) = frontier.lease("w", 1, T0 + 1, 30, policy)
    assert lease.url.startswith("http://a/open/")
    assert frontier.stats().urls_by_state["disallowed"] == 40
    assert len(checked) == 41, checked  # the 40 refused and the one granted
    leases = frontier.lease("w", 7, T0 + 2, 30, policy)
    assert len(leases) == 7 and all(ls.url.startswith("http://a/open/") for ls in leases)
    assert len(checked) == 48


@pytest.mark.parametrize("status", [200, 404])
def test_robots_that_refuse_nothing_check_nothing(frontier: Frontier, status: int) -> None:
    """A robots.txt that refuses nothing (``Allow: /`` only, or a 404: allow all) leases the
    host's best URLs without checking any of them, as many as asked, in priority order."""
    from idemcrawl.frontier.base import RobotsFetch

    checked: list[str] = []
    policy = _counting_robots_policy(checked)
    frontier.add([NewURL(f"http://a/p/{i}", "http://a", priority=i) for i in range(30)], T0)
    (robots,) = frontier.lease("w", 8, T0, 30, policy)
    body = b"User-agent: *\nAllow: /\n# Disallow: /p\n" if status == 200 else b""
    fetched = RobotsFetch(status, body)
    frontier.complete([Completion(robots, status, T0, robots=fetched)], T0, policy)
    leases = frontier.lease("w", 3, T0 + 1, 30, policy)
    assert [ls.url for ls in leases] == ["http://a/p/29", "http://a/p/28", "http://a/p/27"]
    leases = frontier.lease("w", 5, T0 + 2, 30, policy)
    assert [ls.url for ls in leases] == [f"http://a/p/{i}" for i in range(26, 21, -1)]
    assert checked == []
    assert frontier.stats().urls_by_state["queued"] == 22


def test_stale_failure_does_not_back_off_the_host(frontier: Frontier) -> None:
    frontier.add(urls("http://a", 1), T0)
    (lease,) = frontier.lease("w", 1, T0, 30, FAST)
    assert frontier.complete([Completion(lease, 200, T0)], T0, FAST) == [True]
    late = Failure(lease, "timeout", retry_at=T0 + 5, host_error=True)
    assert frontier.fail([late], T0 + 1, FAST) == [False]
    frontier.add(urls("http://a", 1, start=1), T0 + 1)
    assert len(frontier.lease("w", 1, T0 + 1, 30, FAST)) == 1  # not backing off


def test_hosts_with_only_future_retries_do_not_starve_ready_hosts(frontier: Frontier) -> None:
    # 40 hosts whose only URL failed and waits for its retry, at the head of the ready order.
    frontier.add([NewURL(f"http://r{i}/x", f"http://r{i}") for i in range(40)], T0)
    leases = frontier.lease("w", 40, T0, 30, FAST)
    frontier.fail([Failure(ls, "timeout", retry_at=T0 + 600) for ls in leases], T0, FAST)
    frontier.add([NewURL("http://ready/b", "http://ready")], T0 + 1)
    (lease,) = frontier.lease("w", 1, T0 + 2, 30, FAST)
    assert lease.url == "http://ready/b"


def test_ready_hosts_take_turns_by_next_allowed_at(frontier: Frontier) -> None:
    """Level 1 orders ready hosts by their token: a host just granted goes behind the others,
    so one-at-a-time leases at one instant take turns instead of draining one host."""
    frontier.add(urls("http://a", 3) + urls("http://b", 3), T0)
    first = frontier.lease("w", 1, T0, 30, FAST)
    second = frontier.lease("w", 1, T0 + 0.5, 30, FAST)
    assert {first[0].host_key, second[0].host_key} == {"http://a", "http://b"}


def test_host_waiting_for_a_later_url_is_ready_once_a_due_one_arrives(frontier: Frontier) -> None:
    frontier.add([NewURL("http://a/x", "http://a")], T0)
    (ls,) = frontier.lease("w", 1, T0, 30, FAST)
    frontier.fail([Failure(ls, "timeout", retry_at=T0 + 600)], T0, FAST)
    assert frontier.lease("w", 1, T0 + 1, 30, FAST) == []  # only a retry, not yet due
    frontier.add([NewURL("http://a/y", "http://a")], T0 + 2)
    assert [x.url for x in frontier.lease("w", 1, T0 + 2, 30, FAST)] == ["http://a/y"]
    assert [x.url for x in frontier.lease("w", 1, T0 + 600, 30, FAST)] == ["http://a/x"]


def test_start_up_reads_come_a_page_at_a_time(frontier: Frontier) -> None:
    """known_urls, body_digests and simhashes page by key: every row once, in key order."""
    frontier.add([NewURL(f"http://h/p{i}", "http://h") for i in range(7)], T0)
    policy = HostPolicy(max_in_flight=10, delay=0.0)
    leases = frontier.lease("w", 5, T0, 60, policy)
    done = [
        Completion(ls, 200, T0, warc_file="f.warc.gz", warc_offset=i, warc_length=1,
                   payload_digest=f"sha1:{i:04d}", stored_body=True, simhash=i + 1)
        for i, ls in enumerate(leases)
    ]  # fmt: skip
    assert frontier.complete(done, T0, policy) == [True] * 5

    def pages(read: Any, start: Any, key: Any) -> list[list[Any]]:
        out, after = [], start
        while rows := read(after, 2):
            out.append(rows)
            after = key(rows[-1])
        return out

    urls = pages(frontier.known_urls, 0, lambda r: r[0])
    assert [len(p) for p in urls] == [2, 2, 2, 1]
    flat = [r for p in urls for r in p]
    assert [u for _, u in flat] == [f"http://h/p{i}" for i in range(7)]
    assert [i for i, _ in flat] == sorted(i for i, _ in flat)
    assert frontier.known_urls(0, None) == flat
    digests = pages(frontier.body_digests, "", lambda d: d)
    assert [d for p in digests for d in p] == [f"sha1:{i:04d}" for i in range(5)]
    hashes = pages(frontier.simhashes, 0, lambda r: r[0])
    expected = sorted((ls.url_id, i + 1) for i, ls in enumerate(leases))
    assert [(u, h) for p in hashes for u, h, _ in p] == expected


def _counted(frontier: Frontier) -> dict[str, int]:
    """URLs per state counted row by row: what ``stats()`` must report without counting."""
    from idemcrawl.frontier.base import STATES

    out = dict.fromkeys(STATES, 0)
    for row in frontier.url_rows():
        out[row["state"]] += 1
    return out


def test_per_state_totals_equal_a_count_of_the_rows(frontier: Frontier) -> None:
    """``stats().urls_by_state`` comes from kept totals (schema 6: ``url_states``), not from a
    count of every URL: after every kind of state change it still equals the count."""

    def check() -> None:
        assert frontier.stats().urls_by_state == _counted(frontier)

    frontier.add(urls("http://a", 4) + urls("http://b", 3) + urls("http://c", 2), T0)
    frontier.add(
        [*urls("http://a", 2), NewURL("http://d/x", "http://d", state="rejected", reason="trap")],
        T0,
    )  # two duplicates, one rejected
    check()
    leases = frontier.lease("w", 6, T0, 10, FAST)
    assert len(leases) == 6
    check()
    by_host: dict[str, list[Any]] = {}
    for ls in leases:
        by_host.setdefault(ls.host_key, []).append(ls)
    a1, a2, a3 = by_host["http://a"][:3]
    links = [*urls("http://a", 3, start=10), NewURL("http://e/y", "http://e")]
    done = [
        Completion(a1, 200, T0 + 1, [], links, "h", 10, next_fetch_at=T0 + 5),
        Completion(a1, 200, T0 + 1),  # the same lease twice in one batch: once only
    ]
    assert frontier.complete(done, T0 + 1, FAST) == [True, False]
    check()
    assert frontier.fail([Failure(a2, "timeout", retry_at=T0 + 2)], T0 + 1, FAST) == [True]
    assert frontier.fail([Failure(a3, "gone", retry_at=None)], T0 + 1, FAST) == [True]
    check()
    assert frontier.expire(T0 + 10) == 3  # the b and c leases
    check()
    frontier.lease("other", 2, T0 + 11, 10, FAST)
    assert frontier.release_owner("other") > 0
    check()
    frontier.control("block", "http://b")
    check()
    assert frontier.stats().urls_by_state["deferred"] == 3
    frontier.control("unblock", "http://b")
    check()
    assert frontier.reschedule_due(T0 + 20, 10) == 1  # a1's next round
    check()
    assert frontier.stats().urls_by_state["deferred"] == 0


def test_host_counts_equal_a_count_of_the_rows_after_every_move(frontier: Frontier) -> None:
    """I6: every host's queued and in_flight equal its queued and leased URLs after each kind
    of state move. On SQLite since schema 8 the grant (queued -> leased) and the completion
    (leased -> done) count them in their own host writes, and a row trigger the other moves:
    robots.txt queued and leased, disallowed URLs, completions (one rejected as a duplicate),
    retries and final failures, expiry, release, block and unblock, the daily budget's
    deferral, requeue_deferred, a new round and a reparse."""
    from idemcrawl.frontier.base import Reparsed, RobotsFetch
    from idemcrawl.robots import RobotsCache, RobotsSettings

    def check() -> None:
        counted, kept = queued_and_leased_by_host(frontier)
        assert {k: v for k, v in kept.items() if v != [0, 0]} == {
            k: v for k, v in counted.items() if v != [0, 0]
        }
        assert frontier.stats().urls_by_state == _counted(frontier)

    robots = HostPolicy(max_in_flight=8, delay=0.0, robots=RobotsCache(RobotsSettings()))
    frontier.add(urls("http://a", 4) + urls("http://b", 3) + [NewURL("http://r/x/1", "http://r")]
                 + [NewURL("http://r/ok", "http://r")], T0)  # fmt: skip
    check()
    rts = frontier.lease("w", 8, T0, 30, robots)  # the robots.txt of each host: queued, leased
    assert sorted(ls.url for ls in rts) == [f"http://{h}/robots.txt" for h in "abr"]
    check()
    deny = b"User-agent: *\nDisallow: /x\n"
    frontier.complete(
        [Completion(ls, 200, T0, robots=RobotsFetch(200, deny)) for ls in rts], T0, robots
    )
    check()
    leased = frontier.lease("w", 20, T0 + 1, 30, robots)  # http://r/x/1 becomes disallowed
    assert frontier.url_row("http://r/x/1")["state"] == "disallowed"  # type: ignore[index]
    assert len(leased) == 8  # a: 4, b: 3, r: 1
    check()
    by_host: dict[str, list[Any]] = {}
    for ls in leased:
        by_host.setdefault(ls.host_key, []).append(ls)
    a0, a1, a2, _ = by_host["http://a"]
    rec = RecordWrite.make("s", "k", {"x": 1})
    done = [
        Completion(a0, 200, T0 + 2, [rec], urls("http://a", 2, start=10), "h", 10,
                   next_fetch_at=T0 + 5),
        Completion(a0, 200, T0 + 2),  # the same lease twice: once only
        Completion(by_host["http://r"][0], 200, T0 + 2, [], urls("http://c", 2)),
    ]  # fmt: skip
    assert frontier.complete(done, T0 + 2, FAST) == [True, False, True]
    check()
    assert frontier.complete([Completion(a0, 200, T0 + 3)], T0 + 3, FAST) == [False]
    check()
    assert frontier.fail([Failure(a1, "timeout", retry_at=T0 + 3)], T0 + 2, FAST) == [True]
    assert frontier.fail([Failure(a2, "gone", retry_at=None)], T0 + 2, FAST) == [True]
    check()
    assert frontier.expire(T0 + 40) == 4  # a3 and the b leases
    check()
    assert frontier.lease("other", 3, T0 + 41, 30, FAST)
    check()
    assert frontier.release_owner("other") > 0
    check()
    frontier.control("block", "http://b")
    check()
    frontier.control("unblock", "http://b")
    check()
    frontier.control("set-budget", "http://c", 0)
    assert not [ls for ls in frontier.lease("w", 20, T0 + 42, 30, FAST) if "//c" in ls.url]
    assert frontier.stats().urls_by_state["deferred"] == 2  # http://c's two, by the budget
    check()
    frontier.control("set-budget", "http://c", 100)
    assert frontier.requeue_deferred() == 2
    check()
    assert frontier.reschedule_due(T0 + 50, 10) == 1  # a0's next round
    check()
    frontier.apply_reparse([Reparsed(a2.url_id, a2.url, [], [NewURL("http://d/1", "http://d")])],
                           T0 + 51)  # fmt: skip
    assert frontier.url_row(a2.url)["state"] == "done"  # type: ignore[index]
    check()
    # A completion that changes nothing else of its host (no latency, the end gap within the
    # grant's spacing): its host's count is still lowered (SQLite: at the end of the batch).
    frontier.add([NewURL("http://p/1", "http://p")], T0 + 60)
    (p1,) = [ls for ls in frontier.lease("w", 50, T0 + 60, 30, POLITE) if ls.host_key == "http://p"]
    check()
    before = {h["host_key"]: h for h in frontier.host_rows()}["http://p"]
    assert frontier.complete([Completion(p1, 200, T0 + 60)], T0 + 60, POLITE) == [True]
    after = {h["host_key"]: h for h in frontier.host_rows()}["http://p"]
    assert {k: v for k, v in after.items() if before[k] != v} == {"in_flight": 0}
    check()
    # robots.txt expired: a new round of the fetched copy (done -> queued -> leased)
    again = frontier.lease("w", 50, T0 + 10**7, 30, robots)
    assert "http://a/robots.txt" in {ls.url for ls in again}
    check()


@pytest.mark.parametrize("runs", [3, 40])
def test_a_batch_of_unlike_urls_keeps_its_order_values_and_counts(
    frontier: Frontier, runs: int
) -> None:
    """An insert of URLs in runs of alike ones (SQLite binds a run's shared values once, and
    every value per row past 16 runs): each URL keeps its own state, reason, priority, depth,
    the first occurrence of a key decides, url_ids follow the batch's order, hosts count
    their queued URLs (I6)."""
    batch: list[NewURL] = []
    for r in range(runs):
        for k in range(3):
            host = f"http://h{(r + k) % 4}"
            if r % 3 == 2:
                batch.append(NewURL(f"{host}/r{r}/{k}", host, state="rejected", reason="trap"))
            else:
                batch.append(NewURL(f"{host}/r{r}/{k}", host, priority=r % 2, depth=r))
        batch.append(NewURL(f"http://h0/r{max(r - 1, 0)}/0", "http://h0", depth=99))  # known
    first: dict[str, NewURL] = {}
    for u in batch:
        first.setdefault(u.url, u)
    assert frontier.add(batch, T0) == len(first)
    assert frontier.add(batch[:5], T0 + 1) == 0
    assert [u for _, u in frontier.known_urls(0, None)] == list(first)
    for u in first.values():
        row = frontier.url_row(u.url)
        assert row is not None
        assert (row["state"], row["reason"], row["priority"], row["depth"]) == (
            u.state, u.reason, u.priority, u.depth,
        )  # fmt: skip
    queued = {h["host_key"]: h["queued"] for h in frontier.host_rows()}
    for h in {u.host_key for u in first.values()}:
        assert queued[h] == sum(u.state == "queued" for u in first.values() if u.host_key == h)
    assert frontier.stats().urls_by_state == _counted(frontier)


def test_next_due_is_never_later_than_a_queued_url(frontier: Frontier) -> None:
    """``Progress.next_due_at`` (a per-host hint on the SQL backends since schema 6): no later
    than any queued URL's due time, exact when a host's queue starts again from empty."""

    def due() -> float | None:
        queued = [r["due_at"] for r in frontier.url_rows() if r["state"] == "queued"]
        p = frontier.progress(T0 + 100)
        if not queued:
            assert p.next_due_at is None
            return None
        assert p.next_due_at is not None and p.next_due_at <= min(queued)
        return p.next_due_at

    assert due() is None
    frontier.add(urls("http://a", 2), T0)
    assert due() == T0
    leases = frontier.lease("w", 2, T0, 30, FAST)
    assert due() is None
    retry = [Failure(ls, "timeout", retry_at=T0 + 60) for ls in leases]
    assert frontier.fail(retry, T0 + 1, FAST) == [True, True]
    assert due() == T0 + 60  # the queue started again from empty: exact
    frontier.add(urls("http://b", 1), T0 + 2)
    assert due() == T0 + 2
    (b,) = frontier.lease("w", 5, T0 + 2, 30, FAST)
    assert b.host_key == "http://b"
    page = Completion(b, 200, T0 + 3, links=urls("http://b", 1, start=5))
    assert frontier.complete([page], T0 + 3, FAST) == [True]
    assert due() == T0 + 3
