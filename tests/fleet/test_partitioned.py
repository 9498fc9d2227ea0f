"""A crawl over partitions on three PostgreSQL servers, in virtual time: routing by host,
leases that name their partition, the transactional outbox and its forwarder, records in one
partition, membership with fair shares and takeover, and the ownership log."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from idemcrawl.fleet.frontier import PartitionedFrontier, init_map
from idemcrawl.fleet.membership import fair_share
from idemcrawl.fleet.partition_map import PartitionMap, load_map, local_id, make_map
from idemcrawl.frontier.base import (
    Completion,
    Failure,
    Fence,
    FrontierError,
    HostPolicy,
    NewURL,
    RecordWrite,
)

pytestmark = pytest.mark.slow

NewCrawl = Callable[..., tuple[PartitionMap, PartitionedFrontier]]
POLICY = HostPolicy(max_in_flight=4, delay=0.0)


def hosts_in(pmap: PartitionMap, n_per_partition: int = 1) -> dict[int, list[str]]:
    """Host keys grouped by partition, ``n_per_partition`` of each."""
    found: dict[int, list[str]] = {p: [] for p in range(pmap.partitions)}
    i = 0
    while any(len(v) < n_per_partition for v in found.values()):
        h = f"http://h{i}.test"
        p = pmap.of_host(h)
        if len(found[p]) < n_per_partition:
            found[p].append(h)
        i += 1
    return found


def check_ownership_log(log: list[dict[str, Any]]) -> None:
    """Terms of one partition never overlap: at every moment at most one owner."""
    by_part: dict[int, list[dict[str, Any]]] = {}
    for row in log:
        by_part.setdefault(row["partition"], []).append(row)
    for rows in by_part.values():
        rows.sort(key=lambda r: r["epoch"])
        for a, b in itertools.pairwise(rows):
            end = a["released_at"] if a["released_at"] is not None else a["expires_at"]
            assert b["epoch"] > a["epoch"]
            assert b["acquired_at"] >= min(end, a["expires_at"]), (a, b)


def test_the_map_is_found_from_any_server_and_init_is_repeatable(
    new_crawl: NewCrawl, fleet_servers: list[Any]
) -> None:
    pmap, _ = new_crawl(partitions=5)
    for s in fleet_servers:
        assert load_map(s.dsn, pmap.crawl) == pmap
    assert load_map(fleet_servers[0].dsn, "no_such_crawl") is None
    init_map(pmap)  # again: a no-op
    other = make_map(pmap.crawl, 6, pmap.servers)
    with pytest.raises(FrontierError, match="different partition map"):
        init_map(other)


def test_links_cross_partitions_through_the_outbox(new_crawl: NewCrawl) -> None:
    pmap, f = new_crawl(partitions=4)
    by_p = hosts_in(pmap)
    a, b = by_p[0][0], by_p[1][0]
    f.add([NewURL(f"{a}/", a)], 0.0)
    (lease,) = f.lease("m1", 10, 1.0, 30, POLICY)
    assert local_id(lease.url_id)[0] == 0  # the lease names its partition
    links = [NewURL(f"{a}/next", a), NewURL(f"{b}/x", b), NewURL(f"{b}/y", b)]
    assert f.complete([Completion(lease, 200, 1.0, links=links)], 2.0, POLICY) == [True]
    # The local link is in place; the foreign ones wait in partition 0's outbox, committed with
    # the completion, and count as queued work, so nobody finishes meanwhile.
    assert f.parts[0].url_row(f"{a}/next") is not None
    assert f.parts[1].url_row(f"{b}/x") is None
    assert f.parts[0].outbox_count() == 2
    assert f.progress(2.0).queued == 3
    # A stale completion (same lease again) is refused and puts nothing in the outbox.
    assert f.complete([Completion(lease, 200, 1.0, links=links)], 2.5, POLICY) == [False]
    assert f.parts[0].outbox_count() == 2
    # Forwarding delivers them to partition 1 and empties the outbox; repeating is a no-op.
    assert f.forward() == 2
    assert f.parts[0].outbox_count() == 0
    assert {r["url"] for r in f.parts[1].url_rows()} == {f"{b}/x", f"{b}/y"}
    assert f.forward() == 0
    assert f.progress(3.0).queued == 3


def test_the_paced_bound_is_the_whole_call_s_across_partitions(new_crawl: NewCrawl) -> None:
    """``lease(paced=1)`` over hosts with a delay in two partitions grants one lease in all,
    not one per partition; hosts without a delay are not bounded."""
    pmap, f = new_crawl(partitions=2)
    by_p = hosts_in(pmap, 2)
    slow = [by_p[0][0], by_p[1][0]]
    fast = by_p[1][1]
    for h in slow:
        f.set_host_overrides(h, delay=1.0, max_in_flight=None)
    f.add([NewURL(f"{h}/{i}", h) for h in [*slow, fast] for i in range(3)], 0.0)
    leases = f.lease("m1", 10, 1.0, 30, POLICY, paced=1)
    paced = [ls for ls in leases if ls.paced]
    assert len(paced) == 1 and paced[0].host_key in slow
    assert sorted(ls.url for ls in leases if not ls.paced) == [f"{fast}/{i}" for i in range(3)]


def test_a_repeated_forward_changes_nothing(new_crawl: NewCrawl) -> None:
    """A forwarder killed after delivering but before deleting delivers the same rows again."""
    pmap, f = new_crawl(partitions=4)
    by_p = hosts_in(pmap)
    a, b = by_p[2][0], by_p[3][0]
    f.add([NewURL(f"{a}/", a)], 0.0)
    (lease,) = f.lease("m1", 1, 1.0, 30, POLICY)
    rec = RecordWrite.make("shop", "sku-1", {"price": 5})
    f.complete(
        [Completion(lease, 200, 1.0, links=[NewURL(f"{b}/p", b)], records=[rec])], 2.0, POLICY
    )
    src = f.parts[2]
    rows = src.outbox_batch(100)
    # Deliver by hand as a forwarder would, "crash" before the delete, then forward normally.
    f.forward([2])
    for _, target, kind, payload in rows:
        if kind == "link":
            from idemcrawl.fleet.partition import url_from_payload

            f.parts[target].add([url_from_payload(payload)], 5.0)
        else:
            import json

            f.parts[target].upsert_records([json.loads(payload)])
    assert len(f.parts[3].url_rows()) == 1
    records = list(f.records())
    assert len(records) == 1 and records[0]["first_seen"] == 2.0


def test_a_record_lives_in_one_partition_whatever_host_yields_it(new_crawl: NewCrawl) -> None:
    pmap, f = new_crawl(partitions=4)
    by_p = hosts_in(pmap)
    a, b = by_p[0][0], by_p[3][0]  # two hosts in different partitions
    f.add([NewURL(f"{a}/", a), NewURL(f"{b}/", b)], 0.0)
    leases = f.lease("m1", 10, 1.0, 30, POLICY)
    assert len(leases) == 2
    rec = RecordWrite.make("shop", "sku-42", {"name": "kettle"})
    assert f.complete([Completion(x, 200, 1.0, records=[rec]) for x in leases], 2.0, POLICY) == [
        True,
        True,
    ]
    f.forward()
    home = pmap.of_record(rec.record_id)
    for p, part in f.parts.items():
        assert len(list(part.records())) == (1 if p == home else 0)
    assert [r["key"] for r in f.records()] == ["sku-42"]
    # Changed content from a third page (host b) updates the one row; first_seen stays (I5).
    f.add([NewURL(f"{b}/2", b)], 3.0)
    (z,) = f.lease("m1", 10, 4.0, 30, POLICY)
    changed = RecordWrite.make("shop", "sku-42", {"name": "kettle", "price": 9})
    assert f.complete([Completion(z, 200, 5.0, records=[changed])], 5.0, POLICY) == [True]
    f.forward()
    (row,) = list(f.records())
    assert row["first_seen"] == 2.0 and row["last_changed"] == 5.0
    assert row["data"] == changed.data_json
    stats = f.stats()
    assert stats.records == 1 and stats.events == 3


def test_fail_and_complete_reach_the_lease_partition(new_crawl: NewCrawl) -> None:
    pmap, f = new_crawl(partitions=4)
    by_p = hosts_in(pmap, 2)
    urls = [NewURL(f"{h}/", h) for p in range(4) for h in by_p[p]]
    assert f.add(urls, 0.0) == 8
    assert f.add(urls, 0.0) == 0  # I1 across partitions
    leases = f.lease("m1", 100, 1.0, 30, POLICY)
    assert len(leases) == 8
    assert len({local_id(x.url_id)[0] for x in leases}) == 4
    half = len(leases) // 2
    assert (
        f.complete([Completion(x, 200, 1.0) for x in leases[:half]], 2.0, POLICY) == [True] * half
    )
    failing = leases[half:]
    fails = [Failure(x, "boom", None, trace=f"at {i}") for i, x in enumerate(failing)]
    fails[-1] = Failure(failing[-1], "other", None)
    # Failed out of lease order, over partitions: the earliest "boom" is the second lease.
    assert len({local_id(x.url_id)[0] for x in failing}) > 1
    times = [3.0, 2.0, 2.5, 2.0]
    for x, t in zip(fails, times, strict=True):
        assert f.fail([x], t, POLICY) == [True]
    assert f.failure_reasons(5) == [
        {"reason": "boom", "urls": 3, "url": failing[1].url, "trace": "at 1", "failed_at": 2.0},
        {"reason": "other", "urls": 1, "url": failing[3].url, "trace": None, "failed_at": 2.0},
    ]
    agg = f.aggregates()
    assert {k: v for k, v in agg["urls_by_state"].items() if v} == {
        "done": half,
        "failed": len(leases) - half,
    }
    assert f.progress(3.0).finished
    assert sorted(r["url_id"] for r in f.iter_urls(batch=3)) == sorted(x.url_id for x in leases)
    assert len(list(f.iter_events(batch=2))) == half
    assert f.existing_urls([u.url for u in urls] + ["http://nowhere.test/"]) == {
        u.url for u in urls
    }


def test_members_share_partitions_fairly_and_take_over_the_dead(new_crawl: NewCrawl) -> None:
    pmap, f1 = new_crawl(partitions=6, ttl=10.0, tick_every=1.0)
    f2 = PartitionedFrontier(pmap, ttl=10.0, tick_every=1.0)
    f3 = PartitionedFrontier(pmap, ttl=10.0, tick_every=1.0)
    try:
        m1, m2, m3 = f1.membership("m1"), f2.membership("m2"), f3.membership("m3")
        m1.tick(0.0)
        assert len(m1.owned) == 6  # alone: everything
        m2.tick(0.5)  # joins: sees 2 members, nothing free yet
        assert len(m2.owned) == 0
        m1.tick(1.0)  # hands back its surplus ...
        assert len(m1.owned) == 3
        m2.tick(1.5)  # ... which the newcomer takes at once (released, so no TTL wait)
        assert len(m2.owned) == 3
        assert not set(m1.owned) & set(m2.owned)
        m3.tick(2.0)
        m1.tick(2.5)
        m2.tick(2.5)
        m3.tick(3.0)
        assert [len(m.owned) for m in (m1, m2, m3)] == [2, 2, 2] == [fair_share(6, 3)] * 3
        # m3 dies (no more ticks). Its heartbeat expires, the others' share rises, and after
        # its ownership TTL they take its partitions with a new epoch.
        dead = dict(m3.owned)
        t = 3.0
        while t < 14.0:
            t += 1.0
            m1.tick(t)
            m2.tick(t + 0.5)
        assert len(m1.owned) + len(m2.owned) == 6
        for p, owned in dead.items():
            holder = m1.owned.get(p) or m2.owned.get(p)
            assert holder is not None and holder.fence.epoch > owned.fence.epoch
            assert holder.acquired_at <= owned.acquired_at + 10.0 + 2.0  # within TTL + a tick
        # A clean stop hands everything back: m1 then takes it without waiting for a TTL.
        f2.leave(t + 1.0)
        m1.tick(t + 1.5)
        assert len(m1.owned) == 6
        check_ownership_log(f1.ownership_log())
        assert {r["owner"] for r in f1.ownership_log()} == {"m1", "m2", "m3"}
    finally:
        f2.close()
        f3.close()


def test_a_stale_owner_grants_nothing(new_crawl: NewCrawl) -> None:
    """An owner paused past its ownership TTL wakes up after another member took over: its
    fence is stale, so its lease call grants nothing and drops the partition (I9)."""
    pmap, f1 = new_crawl(partitions=2, ttl=5.0, tick_every=1.0)
    f2 = PartitionedFrontier(pmap, ttl=5.0, tick_every=1.0)
    try:
        by_p = hosts_in(pmap, 3)
        f1.add([NewURL(f"{h}/{i}", h) for p in by_p for h in by_p[p] for i in range(3)], 0.0)
        one = HostPolicy(max_in_flight=1, delay=0.0)
        first = f1.lease("m1", 2, 1.0, 60, one)
        assert len(first) == 2 and len(f1.membership("m1").owned) == 2
        # m1 pauses (GC, stopped VM) from t=1 to t=20; m2 joins at t=10 and takes over.
        granted2 = f2.lease("m2", 100, 10.0, 60, one)
        assert len(f2.membership("m2").owned) == 2
        granted2 += f2.lease("m2", 100, 14.0, 60, one) + f2.lease("m2", 100, 18.0, 60, one)
        # m1 wakes up with fences it believes in; lease with them directly: refused.
        for p, o in list(f1.membership("m1").owned.items()):
            with pytest.raises(FrontierError, match="stale"):
                f1.parts[p].lease("m1", 10, 20.0, 60, one, o.fence)
        granted1 = f1.lease("m1", 100, 20.0, 60, one)  # the fleet path: nothing, and it lets go
        assert granted1 == []
        assert f1.membership("m1").owned == {}  # m2 renewed: nothing for m1 to take
        # No URL was granted twice: every lease of m2 is on a host m1 does not hold.
        assert not {x.url for x in granted2} & {x.url for x in first}
        assert f1.lease_audit()["violations"] == 0
        check_ownership_log(f1.ownership_log())
    finally:
        f2.close()


def test_a_fenced_lease_is_refused_by_the_fleet(new_crawl: NewCrawl) -> None:
    _, f = new_crawl(partitions=2)
    with pytest.raises(FrontierError, match="fences its partitions itself"):
        f.lease("m1", 1, 0.0, 30, POLICY, Fence(0, 1))


def test_the_event_cursor_covers_every_partition_and_resumes_exactly(
    new_crawl: NewCrawl,
) -> None:
    from idemcrawl.events import read_events
    from idemcrawl.fleet.frontier import pack_cursor, unpack_cursor

    pmap, f = new_crawl(partitions=4)
    by_p = hosts_in(pmap, 2)
    f.add([NewURL(f"{h}/{i}", h) for p in by_p for h in by_p[p] for i in range(2)], 0.0)
    seen: list[dict[str, Any]] = []
    t = 1.0
    while True:  # complete in rounds; events appear in every partition, interleaved
        leases = f.lease("m1", 3, t, 30, POLICY)
        if not leases:
            break
        f.complete([Completion(x, 200, t) for x in leases], t, POLICY)
        t += 1.0
        # A reader that stops after two events and resumes from the cursor it was given.
        batch = list(read_events(f, seen[-1]["cursor"] if seen else 0, limit=2))
        seen += batch
    seen += list(read_events(f, seen[-1]["cursor"]))
    keys = [e["key"] for e in seen]
    assert len(keys) == len(set(keys)) == 16  # every event once, none skipped
    assert {e["partition"] for e in seen} == {0, 1, 2, 3}
    assert list(read_events(f, seen[-1]["cursor"])) == []
    # Consumer cursors keep each partition's maximum, so a late acknowledgement rewinds nothing.
    f.set_cursor("hook", seen[-1]["cursor"])
    f.set_cursor("hook", seen[3]["cursor"])
    assert f.get_cursor("hook") == seen[-1]["cursor"]
    assert unpack_cursor(pack_cursor([1, 0, 7, 3]), 4) == [1, 0, 7, 3]
    with pytest.raises(FrontierError, match="not an event cursor"):
        unpack_cursor(pack_cursor([1, 2, 3, 4, 5]), 4)


def test_a_server_outage_stalls_only_its_partitions(
    new_crawl: NewCrawl, fleet_servers: list[Any]
) -> None:
    import time

    pmap, f = new_crawl(partitions=6, ttl=30.0, tick_every=1.0)
    by_p = hosts_in(pmap, 2)
    f.add([NewURL(f"{h}/{i}", h) for p in by_p for h in by_p[p] for i in range(4)], 0.0)
    one = HostPolicy(max_in_flight=1, delay=0.0)
    first = f.lease("m1", 100, 1.0, 60, one)
    assert {local_id(x.url_id)[0] for x in first} == set(range(6))
    down = fleet_servers[2]
    lost = {p for p in range(6) if pmap.server(p) == down.dsn}
    down.pause()
    try:
        t = time.monotonic()
        mine = [x for x in first if local_id(x.url_id)[0] not in lost]
        assert f.complete([Completion(x, 200, 2.0) for x in mine], 2.0, one) == [True] * len(mine)
        more = f.lease("m1", 100, 3.0, 60, one)  # ticks (renewals fail for 2 partitions) ...
        prog = f.progress(3.0)
        assert time.monotonic() - t < 10.0  # ... in seconds, not a minute of retries
        assert more and {local_id(x.url_id)[0] for x in more} <= set(range(6)) - lost
        assert not prog.finished
        assert len(f.membership("m1").owned) == 6  # nothing given up for an outage
    finally:
        down.resume()
    time.sleep(2.5)  # past DOWN_FOR: the server is tried again
    back = [x for x in first if local_id(x.url_id)[0] in lost]
    assert f.complete([Completion(x, 200, 5.0) for x in back], 5.0, one) == [True] * len(back)
    again = f.lease("m1", 100, 6.0, 60, one)
    assert {local_id(x.url_id)[0] for x in again} & lost  # its partitions are back


def test_the_cookie_jar_rides_a_server_outage_out(
    new_crawl: NewCrawl, fleet_servers: list[Any]
) -> None:
    """A crawl reloads its jar after every lease call: a partition whose server is away gives
    the cookies it gave last, at once, instead of stalling every partition for a minute."""
    import time

    from idemcrawl.frontier.base import Cookie

    pmap, f = new_crawl(partitions=6)
    down = fleet_servers[2]
    lost = [p for p in range(6) if pmap.server(p) == down.dsn]
    host = hosts_in(pmap, 1)[lost[0]][0]
    f.add([NewURL(f"{host}/login", host)], 0.0)
    (login,) = f.lease("m1", 1, 1.0, 60, POLICY)
    session = Cookie("h", "/", "session", "s1", 3600.0)
    assert f.complete([Completion(login, 200, 1.0, cookies=[session])], 1.0, POLICY) == [True]
    assert f.cookies(2.0) == [session]
    down.pause()
    try:
        t = time.monotonic()
        assert f.cookies(3.0) == [session]  # the away partition's last cookies
        assert f.cookies(3.0) == [session]  # and again, marked down: no wait at all
        assert time.monotonic() - t < 10.0
        assert f.cookies(4000.0) == []  # what expired meanwhile is gone all the same
    finally:
        down.resume()


def test_a_member_starting_during_an_outage_waits_for_the_server(
    new_crawl: NewCrawl, fleet_servers: list[Any]
) -> None:
    import threading
    import time

    pmap, _ = new_crawl(partitions=3)
    down = fleet_servers[1]
    down.pause()
    timer = threading.Timer(1.5, down.resume)
    timer.start()
    t = time.monotonic()
    try:
        f = PartitionedFrontier(pmap)  # partition 1 is on the stopped server
    finally:
        timer.join()
    try:
        assert time.monotonic() - t >= 1.0  # it waited instead of failing the start
        assert f.progress(0.0).finished
    finally:
        f.close()


def test_a_forwarded_link_keeps_its_request_spec() -> None:
    """A link for another partition crosses in its outbox row with its callback, context,
    method, body and render flag (I11), byte for byte."""
    from idemcrawl.fleet.partition import url_from_payload, url_payload
    from idemcrawl.frontier.base import RequestSpec

    spec = RequestSpec("POST", "parse_item", '{"k":1}', '[["X-A","b"]]', b"\x00\xffq=1", True)
    u = NewURL("http://b/x#POST:abc", "http://b", 3, 2, request=spec)
    assert url_from_payload(url_payload(u)) == u
    plain = NewURL("http://b/y", "http://b")
    assert url_from_payload(url_payload(plain)) == plain


def test_start_up_reads_page_across_partitions(new_crawl: NewCrawl) -> None:
    pmap, f = new_crawl(partitions=3)
    by_p = hosts_in(pmap)
    urls = [NewURL(f"{by_p[p][0]}/u{i}", by_p[p][0]) for p in range(3) for i in range(3)]
    f.add(urls, 0.0)
    pages, after = [], 0
    while rows := f.known_urls(after, 4):
        pages.append(rows)
        after = rows[-1][0]
    flat = [r for page in pages for r in page]
    assert [len(p) for p in pages] == [4, 4, 1]
    assert sorted(u for _, u in flat) == sorted(u.url for u in urls)
    assert [i for i, _ in flat] == sorted(i for i, _ in flat)
    assert f.known_urls() == flat
