"""Progress snapshots and live gauges, on a virtual clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from idemcrawl.engine import CrawlSummary, inline
from idemcrawl.engine.reporter import Reporter
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.metrics import LiveGauges

from .conftest import add_pages, lease_all
from .fakes import FakeClock, Spy


def test_snapshots_every_two_seconds_with_crawl_wide_counts_every_ten(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 3)
    lease_all(frontier, clock, 1)
    spy = Spy(frontier)
    summary = CrawlSummary()
    snaps: list[dict[str, Any]] = []
    live = LiveGauges()
    reporter = Reporter(
        spy,
        inline,
        clock,
        summary,
        started=clock.monotonic(),
        in_flight=lambda: 5,
        backlog=lambda: 2,
        snapshot=snaps.append,
        live=live,
    )

    async def main() -> None:
        task = asyncio.create_task(reporter.run())
        await clock.advance(1.9)
        assert snaps == []
        await clock.advance(0.1)
        assert len(snaps) == 1
        summary.fetched, summary.bytes = 40, 4000
        summary.count_error("timeout")
        await clock.advance(2.0)
        assert len(snaps) == 2
        await clock.advance(8.0)  # t = 12 s: six snapshots, the frontier read twice
        assert len(snaps) == 6 and spy.calls["stats"] == 2 and spy.calls["hosts_report"] == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    first, second = snaps[0], snaps[1]
    assert first["elapsed_s"] == 2.0 and first["pages_per_s"] == 0.0
    assert first["urls"] == {"queued": 2, "leased": 1}
    assert first["hosts_ready"] == 1 and first["in_flight"] == 5 and first["parser_backlog"] == 2
    assert second["pages_per_s"] == 20.0 and second["bytes_per_s"] == 2000
    assert second["errors"] == {"timeout": 1}
    assert (live.in_flight, live.parser_backlog, live.pages_per_second) == (
        5,
        2,
        4.0,
    )  # 40 pages in 10 s


def test_without_a_display_a_status_line_is_printed(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    lines: list[str] = []
    summary = CrawlSummary(fetched=7, committed=6, records=3)
    reporter = Reporter(
        frontier,
        inline,
        clock,
        summary,
        started=clock.monotonic() - 4.0,
        in_flight=lambda: 1,
        backlog=lambda: 0,
        progress=lines.append,
    )
    snap = asyncio.run(reporter.tick())
    assert snap["elapsed_s"] == 4.0
    assert lines == ["    4.0s  fetched 7  (0.0/s)  committed 6  records 3  in flight 1  errors 0"]


def test_counts_move_with_commits_and_waiting_hosts_are_named(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """Between full reads, queued/leased come from progress and done/records move with this
    process's commits; with nothing in flight, the snapshot says which host waits, why and
    until when (#18)."""
    from idemcrawl.frontier.base import Failure, HostPolicy

    add_pages(frontier, clock, 3)
    (ls,) = lease_all(frontier, clock, 1)
    summary = CrawlSummary()
    snaps: list[dict[str, Any]] = []
    in_flight = {"n": 1}
    reporter = Reporter(
        frontier,
        inline,
        clock,
        summary,
        started=clock.monotonic(),
        in_flight=lambda: in_flight["n"],
        backlog=lambda: 0,
        snapshot=snaps.append,
    )

    async def main() -> None:
        await reporter.tick()  # the full read: 2 queued, 1 leased
        policy = HostPolicy(max_in_flight=1, delay=0.0)
        retry = Failure(ls, "HTTP 503", clock.now + 600, 503, host_error=True, retry_after=600)
        assert frontier.fail([retry], clock.now, policy) == [True]
        summary.committed += 1  # a failure with a retry: committed, not completed
        in_flight["n"] = 0
        clock.now += 2.0
        await reporter.tick()

    asyncio.run(main())
    first, second = snaps
    assert first["urls"] == {"queued": 2, "leased": 1}
    # Live from progress; a retry is not "done" (only completions move that count).
    assert second["urls"] == {"queued": 3}
    (line,) = second["waiting"]
    assert "3 queued" in line and "Retry-After 600 s" in line and "until" in line
