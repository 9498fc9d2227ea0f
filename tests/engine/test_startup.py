"""The start-up reconciliation, as one synchronous call against a real frontier."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from idemcrawl import owner as owners
from idemcrawl.config import CrawlConfig
from idemcrawl.engine.calls import inline
from idemcrawl.engine.startup import reconcile
from idemcrawl.engine.warmup import Warmup
from idemcrawl.frontier.base import Completion, HostPolicy
from idemcrawl.frontier.sqlite import SQLiteFrontier

from .conftest import HOST, add_pages
from .fakes import FakeClock

FREE = HostPolicy(max_in_flight=10, delay=0.0)


def config(tmp_path: Path, **kw: object) -> CrawlConfig:
    base: dict[str, object] = dict(
        db=str(tmp_path / "crawl.db"),
        seeds=(f"{HOST}/", f"{HOST}/a"),
        sitemaps=(f"{HOST}/sitemap.xml",),
        parse_workers=0,
        commit_batch=32,
        commit_seconds=0.2,
        host_overrides=((HOST, 2.5, 3),),
    )
    base.update(kw)
    return CrawlConfig(**base)  # type: ignore[arg-type]


def test_reconcile_returns_dead_leases_adds_seeds_and_publishes_the_commit_bound(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    cfg = config(tmp_path)
    add_pages(frontier, clock, 3)
    slot = owners.acquire(cfg.db)  # as the engine does first: this process's owner id
    try:
        frontier.lease(slot.owner, 1, clock.now, 3600, FREE)  # the slot's dead predecessor's
        frontier.lease(f"{socket.gethostname()}/7", 1, clock.now, 3600, FREE)  # a dead neighbour
        frontier.lease("far-away/1", 1, clock.now, 3600, FREE)  # alive elsewhere, for all we know
        start = reconcile(frontier, cfg, slot.owner, clock, archive=False)
    finally:
        slot.close()
    assert start.reclaimed == 1 and start.requeued == 0
    assert frontier.owners_with_leases() == ["far-away/1"]
    assert start.scope_hosts == frozenset({HOST})
    for url, kind, priority in ((f"{HOST}/", "page", 1), (f"{HOST}/sitemap.xml", "sitemap", 5)):
        row = frontier.url_row(url)
        assert row is not None and (row["kind"], row["priority"]) == (kind, priority)
    host = frontier.host_row(HOST)
    assert host is not None and (host["delay"], host["max_in_flight"]) == (2.5, 3)
    assert frontier.get_meta("group_commit_max") == "32"
    assert frontier.get_meta("group_commit_linger_s") == "0.2"
    assert start.bodies is None  # no archive, no body filter
    assert start.gate.bloom.might_contain(f"{HOST}/p2")  # the gate knows the frontier's URLs
    known = frontier.stats().urls_by_state
    reconcile(frontier, config(tmp_path), "me/0", clock, archive=False)
    assert frontier.stats().urls_by_state == known  # a restart adds nothing twice


def test_reconcile_rebuilds_the_body_filter_and_the_near_duplicate_index(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = frontier.lease("me/0", 1, clock.now, 60, FREE)
    archived = Completion(
        lease,
        200,
        clock.now,
        warc_file="x.warc.gz",
        warc_offset=0,
        warc_length=10,
        payload_digest="sha1:AAAA",
        stored_body=True,
        simhash=0xF0F0,
    )
    assert frontier.complete([archived], clock.now, FREE) == [True]
    start = reconcile(frontier, config(tmp_path, seeds=()), "me/0", clock, archive=True)
    # Nothing is loaded before the crawl starts: the filters say "maybe" to everything.
    assert start.bodies is not None and start.bodies.warming
    assert start.bodies.might_contain("sha1:ZZZZ") and start.gate.bloom.might_contain("x")
    asyncio.run(
        Warmup(frontier, inline, near=start.near, gate=start.gate, bodies=start.bodies).run()
    )
    assert not start.bodies.warming and not start.gate.bloom.warming
    assert start.bodies.might_contain("sha1:AAAA")
    assert not start.bodies.might_contain("sha1:ZZZZ")
    assert start.gate.bloom.might_contain(lease.url)
    assert not start.gate.bloom.might_contain(f"{HOST}/never-seen")
    assert start.near.group(lease.url_id + 1, 0xF0F1) == lease.url_id  # distance 1: its group


def test_retry_deferred_requeues_only_when_asked(
    tmp_path: Path, frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 3)
    budget = HostPolicy(max_in_flight=10, delay=0.0, daily_budget=1)
    assert len(frontier.lease("far-away/1", 3, clock.now, 60, budget)) == 1
    assert frontier.lease("far-away/1", 3, clock.now, 60, budget) == []  # the budget is spent:
    assert frontier.stats().urls_by_state["deferred"] == 2  # the host's other URLs are deferred
    start = reconcile(
        frontier, config(tmp_path, seeds=(), sitemaps=()), "me/0", clock, archive=False
    )
    assert start.requeued == 0
    start = reconcile(
        frontier,
        config(tmp_path, seeds=(), sitemaps=(), retry_deferred=True),
        "me/0",
        clock,
        archive=False,
    )
    assert start.requeued == 2
    assert frontier.stats().urls_by_state["queued"] == 2
