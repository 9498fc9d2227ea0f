"""The lease feeder: its synchronous core driven step by step, and the task around it.

The core runs here exactly as the virtual-clock simulator would run it: a real SQLite frontier,
a clock that is a number, no asyncio. The task's tests run on a virtual clock too, so "waits
until the lease expires" is checked to the millisecond without waiting.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from idemcrawl.engine import (
    AHEAD_RETRY,
    COALESCE_SECONDS,
    Action,
    CrawlSummary,
    Feeder,
    FeederCore,
    idle_timeout,
    inline,
)
from idemcrawl.frontier.base import Completion, Failure, HostPolicy, Lease
from idemcrawl.frontier.sqlite import SQLiteFrontier

from .conftest import HOST, add_pages
from .fakes import FakeClock, Spy

FREE = HostPolicy(max_in_flight=100, delay=0.0)


def core_for(
    f: Any, clock: FakeClock, *, concurrency: int = 16, policy: HostPolicy = FREE, **kw: Any
) -> FeederCore:
    return FeederCore(
        f,
        clock,
        owner="me/0",
        policy=policy,
        lease_seconds=60.0,
        concurrency=concurrency,
        **kw,
    )


def done(f: SQLiteFrontier, leases: list[Lease], clock: FakeClock, policy: HostPolicy) -> None:
    assert all(f.complete([Completion(ls, 200, clock.time()) for ls in leases], clock.now, policy))


# -- the synchronous core ---------------------------------------------------------------------


def test_leases_as_many_as_idle_workers(frontier: SQLiteFrontier, clock: FakeClock) -> None:
    add_pages(frontier, clock, 10)
    core = core_for(frontier, clock)
    step = core.step(idle=3)
    assert step.action is Action.LEASED and len(step.leases) == 3
    assert core.in_flight == 3 and core.granted == 3
    assert core.step(idle=0).action is Action.WAIT  # nobody idle: no frontier call at all
    assert frontier.progress(clock.now).leased == 3


def test_max_pages_caps_the_grants_then_stops(frontier: SQLiteFrontier, clock: FakeClock) -> None:
    add_pages(frontier, clock, 10)
    core = core_for(frontier, clock, max_pages=4)
    assert len(core.step(idle=3).leases) == 3
    core.settled(3)  # committed: not busy, so no lingering in the way
    step = core.step(idle=3)
    assert step.action is Action.LEASED and len(step.leases) == 1  # 4 - 3 left
    assert core.step(idle=3).action is Action.MAX_PAGES
    assert frontier.progress(clock.now).leased == 4


def test_busy_feeder_lingers_once_for_more_idle_workers(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 30)
    spy = Spy(frontier)
    core = core_for(spy, clock, concurrency=64)  # a lease chunk of 8
    assert core.lease_chunk == 8
    assert len(core.step(idle=8).leases) == 8  # a whole chunk: no waiting
    linger = core.step(idle=2)
    assert linger.action is Action.LINGER and linger.timeout == COALESCE_SECONDS
    assert spy.calls["lease"] == 1  # lingering asked the frontier nothing
    assert len(core.step(idle=2).leases) == 2  # once lingered, lease what there is
    assert core.step(idle=2).action is Action.LINGER  # and the next small ask lingers again
    core.settled(10)
    assert core.step(idle=1).action is Action.LEASED  # not busy: no coalescing


def test_a_lease_call_behind_another_call_does_not_linger_and_serves_the_idle_of_its_turn(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """While a commit holds the frontier's thread, a lease call waits its turn anyway: the
    feeder asks at once, and the call, once it runs, leases for every worker idle by then
    (never more than those, nor past max_pages)."""
    add_pages(frontier, clock, 30)
    core = core_for(frontier, clock, concurrency=64, max_pages=20)
    assert len(core.step(idle=8).leases) == 8  # busy from here on
    assert core.plan(2).action is Action.LINGER
    step = core.plan(2, frontier_busy=True)
    assert step.action is Action.LEASE and step.want == 2
    idle_then = iter([5])
    got = core.lease(step.want, lambda: next(idle_then))
    assert len(got.leases) == 5  # the 2 asked for and the 3 that went idle while it waited
    core.record(got)
    got = core.lease(1, lambda: 30)  # never past max_pages: 20 - 13 granted
    assert len(got.leases) == 7
    assert frontier.progress(clock.now).leased == 20


class _Asked:
    """A frontier that records each lease call's limit and paced bound."""

    def __init__(self, inner: SQLiteFrontier) -> None:
        self.inner = inner
        self.asked: list[tuple[int, int | None]] = []

    def lease(self, owner: str, limit: int, *args: Any, paced: int | None = None) -> Any:
        self.asked.append((limit, paced))
        return self.inner.lease(owner, limit, *args, paced=paced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_ahead_keeps_leases_in_hand_and_refills_half_at_a_time(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """With ``ahead``, a call serves the waiting workers and ``ahead`` more, paced leases only
    for the waiting ones; with leases in hand (``idle`` negative) the feeder asks again only
    when half of what it keeps ahead is gone, and then for no waiting worker at all."""
    add_pages(frontier, clock, 100)
    asked = _Asked(frontier)
    core = core_for(asked, clock, ahead=8)
    step = core.step(idle=2)
    assert step.action is Action.LEASED and len(step.leases) == 10
    assert asked.asked == [(10, 2)]
    # Two workers took theirs; 8 in hand, then 3 of those taken: 5 left, no call.
    assert core.step(idle=-8).action is Action.WAIT
    assert core.step(idle=-5).action is Action.WAIT
    step = core.step(idle=-4)
    assert step.action is Action.LEASED and len(step.leases) == 4
    assert asked.asked[-1] == (4, 0)
    assert core.in_flight == 14 and not core.starved


def test_ahead_pauses_while_the_hosts_cannot_give_more(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """A call ahead that got less than it asked for (here: the queue ran short) turns asking
    ahead off for AHEAD_RETRY seconds: the calls meanwhile are the plain ones, for waiting
    workers, and with leases still in hand there are none."""
    add_pages(frontier, clock, 5)
    asked = _Asked(frontier)
    core = core_for(asked, clock, ahead=8)
    step = core.step(idle=2)
    assert len(step.leases) == 5 and not core.starved  # both waiting workers served
    assert core.step(idle=-3).action is Action.WAIT
    assert asked.asked == [(10, 2)]
    add_pages(frontier, clock, 20, host="http://other.test")
    assert core.step(idle=1).action is Action.LINGER  # the plain feeder's coalescing
    step = core.step(idle=1)
    assert len(step.leases) == 1 and asked.asked[-1] == (1, None)  # a plain call
    clock.now += AHEAD_RETRY
    step = core.step(idle=-2)
    assert step.action is Action.LEASED and asked.asked[-1] == (6, 0)


def test_paced_leases_go_to_the_waiting_workers_first(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """A call ahead returns a host's paced lease after other hosts' leases; the feeder hands
    it out first, so the worker that waits for it starts it at once, as its grant spaced it."""
    fast, slow = "http://a.test", "http://b.test"
    add_pages(frontier, clock, 3, host=fast)
    add_pages(frontier, clock, 6, host=slow)
    frontier.set_host_overrides(slow, delay=1.0, max_in_flight=None)
    order = [ls.paced for ls in frontier.lease("x", 5, clock.now, 60, FREE, paced=1)]
    assert order == [False, False, False, True]  # the frontier's own order puts it last
    frontier.release_owner("x")
    clock.now += 1.0
    core = core_for(frontier, clock, ahead=4)
    feeder, stops = feeder_for(core, clock)

    async def main() -> Lease | None:
        task = asyncio.create_task(feeder.run())
        first = await feeder.next_lease()
        stops.append("test")
        feeder.wake()
        await asyncio.wait_for(task, 1)
        return first

    first = asyncio.run(main())
    assert first is not None and first.paced and first.host_key == slow


def test_finished_only_when_nothing_is_left_anywhere(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    core = core_for(frontier, clock)
    (lease,) = core.step(idle=4).leases
    done(frontier, [lease], clock, FREE)
    # Committed in the frontier, but this process has not heard of it yet: not finished.
    assert core.step(idle=4).action is Action.IDLE
    core.settled(1)
    assert core.step(idle=4).action is Action.FINISHED


def test_recrawl_never_finishes_and_starts_rounds_once_a_second(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    spy = Spy(frontier)
    core = core_for(spy, clock, recrawl=True)
    (lease,) = core.step(idle=1).leases
    assert frontier.complete(
        [Completion(lease, 200, clock.now, next_fetch_at=clock.now + 30)], clock.now, FREE
    ) == [True]
    core.settled(1)
    step = core.step(idle=1)
    assert step.action is Action.IDLE  # recrawl: nothing due, but never finished
    assert step.timeout == 1.0  # the refetch is 30 s away: look again within a second
    assert spy.calls["reschedule_due"] == 1  # the first lease round already asked
    clock.now += 0.5
    core.step(idle=1)
    assert spy.calls["reschedule_due"] == 1  # not again within the second
    clock.now += 30
    step = core.step(idle=1)
    assert spy.calls["reschedule_due"] == 2
    assert step.action is Action.LEASED and step.revisits == 1
    assert step.leases[0].version == 2  # a new round of the same URL


def test_dead_local_owners_are_looked_for_at_most_every_two_seconds(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 1)
    frontier.lease("elsewhere/3", 1, clock.now, 60, FREE)  # someone else's lease
    looked: list[float] = []

    def reclaim() -> int:
        looked.append(clock.now)
        return 0

    core = core_for(frontier, clock, reclaim=reclaim)
    t0 = clock.now
    for _ in range(4):  # t0, +0.9, +1.8, +2.7
        assert core.step(idle=1).action is Action.IDLE
        clock.now += 0.9
    assert looked == [t0, pytest.approx(t0 + 2.7)]
    frontier.release_owner("elsewhere/3")
    assert len(core.step(idle=1).leases) == 1


def test_idle_wait_is_never_a_busy_loop_nor_blind_for_over_a_second() -> None:
    assert idle_timeout(100.3, 100.0) == pytest.approx(0.3)
    assert idle_timeout(99.0, 100.0) == 0.005  # already past: a short poll, not a spin
    assert idle_timeout(500.0, 100.0) == 1.0


def test_idle_waits_for_the_next_lease_expiry(frontier: SQLiteFrontier, clock: FakeClock) -> None:
    add_pages(frontier, clock, 1)
    frontier.lease("elsewhere/3", 1, clock.now, 0.7, FREE)
    step = core_for(frontier, clock).step(idle=1)
    assert step.action is Action.IDLE and step.timeout == pytest.approx(0.7)


def test_the_core_alone_runs_a_polite_crawl_on_a_virtual_clock(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """What the simulator does: step, complete what was granted, let virtual time pass."""
    policy = HostPolicy(max_in_flight=1, delay=1.0)
    for host in ("http://a.test", "http://b.test"):
        add_pages(frontier, clock, 3, host)
    core = core_for(frontier, clock, concurrency=4, policy=policy)
    t0 = clock.now
    grants: dict[str, list[float]] = {}
    for _ in range(10_000):
        step = core.step(idle=4 - core.in_flight)
        if step.action is Action.FINISHED:
            break
        if step.action is Action.LEASED:
            for lease in step.leases:
                grants.setdefault(lease.host_key, []).append(clock.now)
            clock.now += 0.05  # each response takes 50 ms
            done(frontier, step.leases, clock, policy)
            core.settled(len(step.leases))
        else:
            clock.now += step.timeout or 0.0
    else:
        raise AssertionError("the crawl did not finish")
    assert sorted(grants) == ["http://a.test", "http://b.test"]
    for times in grants.values():
        assert len(times) == 3
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert min(gaps) >= 1.0 - 1e-9  # the host's delay between request starts
    assert clock.now - t0 < 2.5  # the two hosts were crawled side by side
    assert core.granted == 6 and core.in_flight == 0


# -- the task ------------------------------------------------------------------------------------


def feeder_for(core: FeederCore, clock: FakeClock, **kw: Any) -> tuple[Feeder, list[str]]:
    stops: list[str] = []
    feeder = Feeder(
        core,
        inline,
        clock,
        workers=2,
        summary=CrawlSummary(),
        stopped=lambda: bool(stops),
        stop=stops.append,
        **kw,
    )
    return feeder, stops


def test_feeder_sleeps_until_a_foreign_lease_expires_then_takes_it(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    (url,) = add_pages(frontier, clock, 1)
    frontier.lease("elsewhere/3", 1, clock.now, 0.7, FREE)
    messages: list[str] = []
    feeder, stops = feeder_for(core_for(frontier, clock), clock, progress=messages.append)

    async def main() -> None:
        task = asyncio.create_task(feeder.run())
        worker = asyncio.create_task(feeder.next_lease())
        await clock.advance(0)
        assert clock.deadlines == [pytest.approx(clock.now + 0.7)]  # no polling before
        await clock.advance(0.69)
        assert not worker.done()
        await clock.advance(0.01)
        lease = await asyncio.wait_for(worker, 1)
        assert lease is not None and lease.url == url and lease.owner == "me/0"
        stops.append("test")
        feeder.wake()
        await asyncio.wait_for(task, 1)

    asyncio.run(main())
    assert messages == []  # "elsewhere" is not a process of this machine


def test_feeder_wakes_when_a_url_comes_due(frontier: SQLiteFrontier, clock: FakeClock) -> None:
    policy = HostPolicy(max_in_flight=1, delay=0.7)
    add_pages(frontier, clock, 1)
    (lease,) = frontier.lease("me/0", 1, clock.now, 60, policy)
    # A retry 0.7 s from now, on a host whose delay also ends then.
    assert frontier.fail([Failure(lease, "x", clock.now + 0.7)], clock.now, policy) == [True]
    feeder, stops = feeder_for(core_for(frontier, clock, policy=policy), clock)

    async def main() -> None:
        task = asyncio.create_task(feeder.run())
        worker = asyncio.create_task(feeder.next_lease())
        await clock.advance(0.6)
        assert not worker.done()
        await clock.advance(0.1)
        got = await asyncio.wait_for(worker, 1)
        assert got is not None and got.url == lease.url and got.attempts == 1
        stops.append("test")
        feeder.wake()
        await asyncio.wait_for(task, 1)

    asyncio.run(main())


def test_feeder_hands_out_leases_and_ends_every_worker(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 3)
    feeder, stops = feeder_for(core_for(frontier, clock), clock)
    got: list[Lease | None] = []

    async def worker() -> None:
        while (lease := await feeder.next_lease()) is not None:
            got.append(lease)
            await asyncio.sleep(0)
            done(frontier, [lease], clock, FREE)
            feeder.settled(1)
        got.append(None)

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(feeder.run())
            tg.create_task(worker())
            tg.create_task(worker())
            # Only virtual time can pass; a finished crawl must need none.

    asyncio.run(asyncio.wait_for(main(), 5))
    assert sorted(ls.url for ls in got if ls is not None) == [f"{HOST}/p{i}" for i in range(3)]
    assert got.count(None) == 2  # each worker was told to end
    assert stops == []  # finished, not stopped


def test_feeder_stops_at_max_pages(frontier: SQLiteFrontier, clock: FakeClock) -> None:
    add_pages(frontier, clock, 5)
    feeder, stops = feeder_for(core_for(frontier, clock, max_pages=2), clock)

    async def main() -> list[Lease]:
        task = asyncio.create_task(feeder.run())
        leases = [await feeder.next_lease(), await feeder.next_lease()]
        await asyncio.wait_for(task, 1)
        return [ls for ls in leases if ls is not None]

    assert len(asyncio.run(main())) == 2
    assert stops == ["max-pages"]
    assert frontier.progress(clock.now).leased == 2


# -- waiting is free, and a finite crawl ends (#18) ----------------------------------------------

POLITE = HostPolicy(max_in_flight=1, delay=1.0)


def test_idle_wakes_when_the_host_timer_opens_not_at_once(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    """URLs due long ago on a host whose timer runs on: the feeder sleeps until the timer,
    instead of polling every few milliseconds (which cost a delay-1 crawl 5x the CPU)."""
    add_pages(frontier, clock, 3)
    core = core_for(frontier, clock, policy=POLITE)
    (ls,) = core.step(idle=4).leases
    clock.now += 0.2
    done(frontier, [ls], clock, POLITE)
    core.settled(1)
    step = core.step(idle=4)
    assert step.action is Action.IDLE
    assert step.timeout == pytest.approx(1.0)  # the next start: 1 s after the response ended


def test_horizon_stops_a_crawl_that_only_waits(frontier: SQLiteFrontier, clock: FakeClock) -> None:
    add_pages(frontier, clock, 1)
    core = core_for(frontier, clock, policy=POLITE, horizon=60.0)
    (ls,) = core.step(idle=2).leases
    failure = Failure(ls, "HTTP 503", retry_at=clock.now + 3600, status=503, host_error=True)
    assert frontier.fail([failure], clock.now, POLITE) == [True]
    core.settled(1)
    step = core.step(idle=2)
    assert step.action is Action.HORIZON
    assert step.until is not None and step.until >= clock.now + 3600
    # Within the horizon it waits instead; and without one it waits however long.
    near = core_for(frontier, clock, policy=POLITE, horizon=7200.0).step(idle=2)
    assert near.action is Action.IDLE and near.timeout == 1.0
    assert core_for(frontier, clock, policy=POLITE).step(idle=2).action is Action.IDLE


def test_horizon_waits_for_leases_held_elsewhere_and_for_the_operator(
    frontier: SQLiteFrontier, clock: FakeClock
) -> None:
    add_pages(frontier, clock, 2)
    other = frontier.lease("other/1", 1, clock.now, 600.0, POLITE)
    assert len(other) == 1
    core = core_for(frontier, clock, policy=POLITE, horizon=1.0)
    # Another process is fetching: its answer may queue more work; never stop under it.
    assert core.step(idle=2).action is Action.IDLE
    frontier.release_owner("other/1")
    frontier.control("pause")
    # Paused by the operator: no time to wait for, the crawl waits to be resumed.
    assert core.step(idle=2).action is Action.IDLE
    frontier.control("resume")
    clock.now += 1.0  # the host's delay after the other process's grant
    assert core.step(idle=2).action is Action.LEASED


def test_feeder_task_stops_at_the_horizon(frontier: SQLiteFrontier, clock: FakeClock) -> None:
    add_pages(frontier, clock, 1)
    (ls,) = frontier.lease("x/0", 1, clock.now, 60.0, POLITE)
    assert frontier.fail([Failure(ls, "HTTP 503", clock.now + 900, 503)], clock.now, POLITE)
    feeder, stops = feeder_for(core_for(frontier, clock, policy=POLITE, horizon=60.0), clock)

    async def main() -> None:
        task = asyncio.create_task(feeder.run())
        worker = asyncio.create_task(feeder.next_lease())
        await clock.advance(0)
        await asyncio.wait_for(task, 1)  # no wait at all: nothing can start for 15 min
        assert await asyncio.wait_for(worker, 1) is None  # and the worker is told to end

    asyncio.run(main())
    assert stops == ["horizon"]
