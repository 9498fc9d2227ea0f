"""Group commit: batch formation, lingering on the (virtual) clock, accounting."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from idemcrawl.engine import COALESCE_SECONDS, Committer, CrawlSummary, inline
from idemcrawl.frontier.base import Completion, Failure, HostPolicy, RecordWrite
from idemcrawl.frontier.sqlite import SQLiteFrontier

from .conftest import add_pages, lease_all
from .fakes import FakeClock, settle

T = TypeVar("T")
POLICY = HostPolicy(max_in_flight=100, delay=0.0)


class Transactions:
    """A frontier call that waits for the test to let each transaction finish."""

    def __init__(self) -> None:
        self.started = 0
        self._release = asyncio.Semaphore(0)

    async def __call__(self, fn: Callable[..., T], /, *args: Any) -> T:
        self.started += 1
        await self._release.acquire()
        return fn(*args)

    def finish(self, n: int = 1) -> None:
        for _ in range(n):
            self._release.release()


def committer_for(
    f: SQLiteFrontier,
    clock: FakeClock,
    *,
    call: Any = inline,
    batch: int = 64,
    linger: float = 0.0,
    busy: bool = False,
) -> tuple[Committer, CrawlSummary, list[int]]:
    summary = CrawlSummary()
    settled: list[int] = []
    committer = Committer(
        f,
        call,
        clock,
        POLICY,
        summary,
        batch=batch,
        linger=linger,
        queue_size=128,
        busy=lambda: busy,
        settled=settled.append,
    )
    return committer, summary, settled


def test_a_batch_is_what_arrived_while_the_previous_transaction_ran(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 6)
    leases = lease_all(frontier, clock, 6)
    tx = Transactions()
    committer, summary, settled = committer_for(frontier, clock, call=tx, batch=3)

    async def main() -> None:
        task = asyncio.create_task(committer.run())
        await committer.put(Completion(leases[0], 200, clock.now))
        await settle()
        assert tx.started == 1  # alone, at once: nothing else was there
        for lease in leases[1:]:  # five arrive while that transaction runs
            await committer.put(Completion(lease, 200, clock.now))
        await committer.close()
        tx.finish(4)
        await asyncio.wait_for(task, 1)

    asyncio.run(main())
    assert settled == [1, 3, 2]  # then batches of at most commit_batch
    assert summary.commit_batches == 3 and summary.commit_max_batch == 3
    assert summary.committed == 6 and summary.rejected_completions == 0
    assert frontier.stats().urls_by_state["done"] == 6


def test_a_batch_lingers_for_commit_seconds_on_the_clock(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 3)
    leases = lease_all(frontier, clock, 3)
    committer, summary, settled = committer_for(frontier, clock, linger=0.5)

    async def main() -> None:
        task = asyncio.create_task(committer.run())
        await committer.put(Completion(leases[0], 200, clock.now))
        await clock.advance(0.3)
        assert settled == []  # still lingering
        await committer.put(Completion(leases[1], 200, clock.now))
        await clock.advance(0.19)
        assert settled == []
        await clock.advance(0.01)
        assert settled == [2]  # both, in one transaction, at the deadline
        await committer.put(Completion(leases[2], 200, clock.now))
        await committer.close()  # closing does not wait out the linger
        await asyncio.wait_for(task, 1)

    asyncio.run(main())
    assert settled == [2, 1]
    assert summary.committed == 3


def test_a_busy_crawl_coalesces_commits_briefly(frontier: SQLiteFrontier, clock: FakeClock) -> None:
    add_pages(frontier, clock, 2)
    leases = lease_all(frontier, clock, 2)
    committer, _, settled = committer_for(frontier, clock, busy=True)

    async def main() -> None:
        task = asyncio.create_task(committer.run())
        await committer.put(Completion(leases[0], 200, clock.now))
        await settle()
        assert clock.waits == [pytest.approx(COALESCE_SECONDS)] and settled == []
        await committer.put(Completion(leases[1], 200, clock.now))
        await clock.advance(COALESCE_SECONDS)
        assert settled == [2]
        await committer.close()
        await asyncio.wait_for(task, 1)

    asyncio.run(main())


def test_a_busy_crawl_lingers_twice_as_long_as_its_last_commit_took(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """Where a commit costs more (PostgreSQL), a busy crawl waits longer for a bigger batch:
    twice the last commit's own time, never less than COALESCE_SECONDS nor more than
    LINGER_MAX."""
    from idemcrawl.engine.committer import LINGER_MAX

    add_pages(frontier, clock, 4)
    leases = lease_all(frontier, clock, 4)
    took = [0.02, 0.5, 0.0]

    class SlowCommits:
        def __getattr__(self, name: str) -> Any:
            return getattr(frontier, name)

        def complete(self, *args: Any) -> Any:
            clock.now += took.pop(0)  # the transaction's own time, on the frontier's thread
            return frontier.complete(*args)

    committer, _, settled = committer_for(SlowCommits(), clock, busy=True)  # type: ignore[arg-type]

    async def main() -> None:
        task = asyncio.create_task(committer.run())
        await committer.put(Completion(leases[0], 200, clock.now))
        await settle()
        assert clock.waits == [pytest.approx(COALESCE_SECONDS)]  # no commit measured yet
        await clock.advance(COALESCE_SECONDS)
        assert settled == [1]
        await committer.put(Completion(leases[1], 200, clock.now))
        await settle()
        assert clock.waits[-1] == pytest.approx(0.04)  # 2 x 20 ms
        await committer.put(Completion(leases[2], 200, clock.now))
        await clock.advance(0.04)
        assert settled == [1, 2]
        await committer.put(Completion(leases[3], 200, clock.now))
        await settle()
        assert clock.waits[-1] == pytest.approx(LINGER_MAX)  # 2 x 500 ms, capped
        await committer.close()
        await asyncio.wait_for(task, 1)

    asyncio.run(main())
    assert settled == [1, 2, 1]


def test_an_idle_crawl_commits_each_page_at_once(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    (lease,) = lease_all(frontier, clock, 1)
    committer, _, settled = committer_for(frontier, clock)

    async def main() -> None:
        task = asyncio.create_task(committer.run())
        await committer.put(Completion(lease, 200, clock.now))
        await settle()
        assert settled == [1] and clock.waits == []  # no timer at all
        await committer.close()
        await asyncio.wait_for(task, 1)

    asyncio.run(main())


def test_outcomes_are_counted_as_the_frontier_accepted_them(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 3)
    a, b, c = lease_all(frontier, clock, 3)
    record = RecordWrite.make("shop", "sku-1", {"price": 1})
    committer, summary, settled = committer_for(frontier, clock)

    async def main() -> None:
        task = asyncio.create_task(committer.run())
        await committer.put(Completion(a, 200, clock.now, records=[record]))
        await committer.put(Completion(a, 200, clock.now, records=[record]))  # a duplicate
        await committer.put(Failure(b, "HTTP 503", retry_at=clock.now + 5))  # retried later
        await committer.put(Failure(c, "parse error", retry_at=None))  # final
        await committer.close()
        await asyncio.wait_for(task, 1)

    asyncio.run(main())
    assert summary.committed == 3 and summary.rejected_completions == 1
    assert summary.records == 1 and summary.failed == 1
    assert sum(settled) == 4  # every outcome leaves the in-flight account, accepted or not
