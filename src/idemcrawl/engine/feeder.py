"""The lease feeder: how many URLs to lease, when, and when the crawl is over.

Two layers, so that the decisions can be driven without asyncio:

* :class:`FeederCore` is synchronous. It holds every decision — how many leases idle workers and
  in-flight work call for, the ``max_pages`` account, lease coalescing under load, starting recrawl
  rounds once a second, and, when nothing is granted, whether the crawl is finished, whether a
  dead local process's leases should be reclaimed, and when to look again. It calls the frontier
  and reads the clock directly, so the virtual-clock simulator can run the very same policy with
  any backend and a number for a clock: ``step(idle)`` is one whole decision.
* :class:`Feeder` is the task the engine runs: a thin loop that performs what the core decided
  (hands leases to workers, waits for a wake-up or a timeout) and runs the core's frontier half on
  the frontier's thread.

Why lease for idle workers: a lease is then granted right before its request starts (a host's
delay is measured between grants), and a kill strands little more than the fetches really in
flight. With ``ahead`` (``--lease-ahead``) the feeder also keeps up to that many leases in hand
beyond its waiting workers, so that a worker that finishes takes its next lease at once instead
of waiting for a lease transaction (on PostgreSQL a worker waited 13-14 ms per page for one, on
SQLite 8 ms), and one transaction serves many more pages. Only leases that may wait are kept so:
the frontier gives a call no more *paced* leases (those of hosts spaced by a gap, whose requests
must start when granted) than it has waiting workers (``lease(paced=...)``), and those go to the
waiting workers first. When the hosts cannot give more (all spaced by a gap, or their slots
taken), the feeder stops asking ahead for ``AHEAD_RETRY`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..cookies import CookieJar
from ..frontier.base import Frontier, HostPolicy, Lease
from .calls import Call, busy
from .clock import Clock, WallClock
from .summary import CrawlSummary

#: Under load, the feeder waits this long for more idle workers before a lease call, and the
#: committer this long for more completions before a commit (when ``commit_seconds`` is 0): one
#: transaction then serves several pages instead of one (docs/benchmarks.md, profile).
COALESCE_SECONDS = 0.01
#: A recrawl run starts the rounds that came due at most this often, this many at a time (R16).
RESCHEDULE_EVERY = 1.0
RESCHEDULE_LIMIT = 1000
#: Someone else holds leases: look for dead local owners at most this often.
RECLAIM_EVERY = 2.0
#: A call that asked ahead got less than it asked for: ask only for waiting workers this long
#: (each call ahead would read and lock ready hosts that cannot give it anything).
AHEAD_RETRY = 1.0
#: Nothing granted: look again at the frontier's next interesting moment, within these bounds
#: (the upper one also catches what no wake-up announces: another process's commits).
IDLE_POLL_MIN = 0.005
IDLE_POLL_MAX = 1.0


class Action(enum.Enum):
    """What the feeder does next."""

    #: Ask the frontier for ``want`` leases (:meth:`FeederCore.lease`).
    LEASE = "lease"
    #: Leases were granted: hand them out, then decide again at once (or, when the hosts gave
    #: less than asked, after ``timeout``: when the next grant can come, or a wake-up).
    LEASED = "leased"
    #: No idle worker wants a lease: wait for a wake-up (a worker going idle, a commit).
    WAIT = "wait"
    #: Busy: wait ``timeout`` (COALESCE_SECONDS) for more workers to go idle, then decide again.
    LINGER = "linger"
    #: Nothing could be granted: wait ``timeout`` seconds or for a wake-up.
    IDLE = "idle"
    #: Nothing queued or leased anywhere and nothing of ours in flight: the crawl is done.
    FINISHED = "finished"
    #: This run's ``max_pages`` leases are granted: stop.
    MAX_PAGES = "max-pages"
    #: Nothing is in flight anywhere and all that is left waits past the horizon (a host
    #: resting an hour after its robots.txt failed, a retry due tomorrow): stop, work left.
    HORIZON = "horizon"


@dataclass(slots=True)
class Step:
    action: Action
    #: LEASE: how many leases to ask for, and how many of them are for waiting workers (the
    #: rest are leases ahead; the call's paced bound, see the module docstring).
    want: int = 0
    waiting: int = 0
    #: LEASED: the grants, in the frontier's order.
    leases: list[Lease] = field(default_factory=list)
    #: LINGER, IDLE: seconds to wait at most.
    timeout: float | None = None
    #: HORIZON: the earliest moment anything left could be granted.
    until: float | None = None
    #: Recrawl rounds started by this step, and dead owners' leases it returned.
    revisits: int = 0
    reclaimed: int = 0


def idle_timeout(wake_at: float, now: float) -> float:
    """How long to wait for ``wake_at``: exactly that when it is ahead (a 2.5 ms adaptive gap
    is waited as such), a short poll rather than a spin when it has passed without a grant,
    and never blind for more than 1 s."""
    if wake_at <= now:
        return IDLE_POLL_MIN
    return min(wake_at - now, IDLE_POLL_MAX)


class FeederCore:
    """The feeder's decisions, synchronous (see the module docstring).

    ``in_flight`` counts leases this process was granted and has not committed or dropped yet;
    the owner of the leases reports those with :meth:`settled`. ``reclaim`` returns the leases of
    dead processes of this machine (None: there are none to find, as in a simulation).

    Threads: :meth:`lease` may run on the frontier's thread. It writes the reschedule and
    reclaim timers, which nothing else touches, and ``starved`` and the end of a pause in
    asking ahead, which :meth:`plan` reads only after the call returned (the loop awaits it);
    it reads ``in_flight``, which meanwhile can only fall (commits), so a stale value at worst
    postpones "finished" to the next wake-up. Everything else runs on one thread (the event
    loop's).
    """

    def __init__(
        self,
        frontier: Frontier,
        clock: WallClock,
        *,
        owner: str,
        policy: HostPolicy,
        lease_seconds: float,
        concurrency: int,
        max_pages: int | None = None,
        recrawl: bool = False,
        reclaim: Callable[[], int] | None = None,
        horizon: float | None = None,
        cookies: CookieJar | None = None,
        ahead: int = 0,
    ) -> None:
        self.frontier = frontier
        #: The crawl's cookie jar, reloaded after every lease call that granted something:
        #: the granted URLs were inserted with (or after) the cookies they need (I12).
        self.cookies = cookies
        self.clock = clock
        self.owner = owner
        self.policy = policy
        self.lease_seconds = lease_seconds
        self.max_pages = max_pages
        self.recrawl = recrawl
        self._reclaim = reclaim
        #: Stop (work left) when nothing can start sooner than this many seconds from now and
        #: nothing is in flight anywhere; None waits as long as it takes. Never with recrawl.
        self.horizon = horizon
        #: Idle workers worth one lease transaction without waiting (see COALESCE_SECONDS).
        self.lease_chunk = max(2, concurrency // 8)
        self.granted = 0
        self.in_flight = 0
        #: The last lease call granted less than it asked for: hosts, not idle workers, are the
        #: limit (one polite host, a few slow ones). Waiting for more idle workers or holding
        #: completions back then only keeps host slots taken longer, so nothing lingers.
        self.starved = False
        #: Leases to keep in hand beyond the waiting workers (see the module docstring), and
        #: until when asking ahead is off (AHEAD_RETRY).
        self.ahead = max(0, ahead)
        self._ahead_off_until = 0.0
        self._lingered = False
        self._next_reschedule = 0.0
        self._next_reclaim = 0.0

    @property
    def busy(self) -> bool:
        """More in flight than one lease chunk and work enough for every worker: more
        completions are moments away and nobody waits for their host slots (the committer's
        reason to linger)."""
        return self.in_flight > self.lease_chunk and not self.starved

    def plan(self, idle: int, frontier_busy: bool = False) -> Step:
        """The decision before any frontier call; ``idle`` = workers without a lease to start.
        ``frontier_busy``: another call (a commit) holds the frontier's thread, so a lease call
        waits its turn anyway and asks for the workers idle by then (:meth:`lease`'s
        ``more``): lingering first would only add to the wait."""
        if self.max_pages is not None and self.granted >= self.max_pages:
            return Step(Action.MAX_PAGES)
        if self._asks_ahead(self.clock.time()):
            # ``idle`` is negative while leases wait in hand: refill when a worker waits or
            # half of what is kept ahead is gone, so that one call serves many pages.
            want = self._within_max_pages(idle + self.ahead)
            if want > 0 and (idle > 0 or want >= max(1, self.ahead // 2)):
                return Step(Action.LEASE, want=want, waiting=max(0, idle))
            return Step(Action.WAIT)
        want = self._within_max_pages(idle)
        if want <= 0:
            return Step(Action.WAIT)
        if (
            want < self.lease_chunk
            and self.in_flight >= self.lease_chunk
            and not self._lingered
            and not self.starved
            and not frontier_busy
        ):
            # Busy: let a few more workers become idle so that one lease transaction serves
            # them all (a lease per page made the lease path the top SQL cost).
            self._lingered = True
            return Step(Action.LINGER, timeout=COALESCE_SECONDS)
        self._lingered = False
        return Step(Action.LEASE, want=want, waiting=want)

    def _asks_ahead(self, now: float) -> bool:
        return self.ahead > 0 and now >= self._ahead_off_until

    def _within_max_pages(self, want: int) -> int:
        """``want`` leases, no more than this run's ``max_pages`` leaves."""
        if self.max_pages is None:
            return want
        return min(want, self.max_pages - self.granted)

    def lease(
        self, want: int, more: Callable[[], int] | None = None, waiting: int | None = None
    ) -> Step:
        """The frontier half: start due recrawl rounds, lease, or find out why nothing came.
        ``more``: the workers idle now, read when the call starts (they only grow while the
        feeder waits for this call), so that a call that waited for the frontier's thread
        serves the workers that went idle meanwhile too. ``waiting``: how many of ``want``
        are for waiting workers when ``more`` is not given (:attr:`Step.waiting`; None: all)."""
        f = self.frontier
        now = self.clock.time()
        ahead = self.ahead if self._asks_ahead(now) else 0
        if more is not None:
            idle = more()
            waiting = max(0, idle)
            want = self._within_max_pages(max(want, idle + ahead))
        elif waiting is None:
            waiting = want
        revisits = 0
        if self.recrawl and now >= self._next_reschedule:
            # R16: start a new round (version + 1) for URLs whose next_fetch_at came.
            self._next_reschedule = now + RESCHEDULE_EVERY
            revisits = f.reschedule_due(now, RESCHEDULE_LIMIT)
        if ahead:
            leases = f.lease(
                self.owner, want, now, self.lease_seconds, self.policy, paced=waiting
            )
            if len(leases) < want:
                self._ahead_off_until = now + AHEAD_RETRY
            # Starved: a waiting worker got nothing. Short only of leases ahead: not starved.
            self.starved = len(leases) < min(want, waiting)
        else:
            leases = f.lease(self.owner, want, now, self.lease_seconds, self.policy)
            self.starved = len(leases) < want
        if leases and self.cookies is not None:
            self.cookies.load(f.cookies(now))
        if not self.starved and (leases or (ahead and not waiting)):
            return Step(Action.LEASED, leases=leases, revisits=revisits)
        prog = f.progress(now, self.policy.max_in_flight)
        if leases:
            # The hosts gave less than asked (one polite host spacing its starts): asking again
            # at once would only be an empty transaction; look again when the next can start.
            wake = min(
                (t for t in (prog.next_ready_at, prog.next_lease_expiry) if t is not None),
                default=now + IDLE_POLL_MAX,
            )
            timeout = idle_timeout(wake, self.clock.time())
            return Step(Action.LEASED, leases=leases, timeout=timeout, revisits=revisits)
        if prog.finished and self.in_flight == 0 and not self.recrawl:
            return Step(Action.FINISHED, revisits=revisits)
        reclaimed = 0
        if prog.leased > self.in_flight and now >= self._next_reclaim and self._reclaim:
            # Someone else holds leases: if it was a process of this machine that died, return
            # its work now instead of waiting for the leases to expire.
            self._next_reclaim = now + RECLAIM_EVERY
            reclaimed = self._reclaim()
        # When something could be granted: a host's timer, back-off and first due URL together
        # (not the earliest due URL of a host whose timer still runs: waiting for that is a
        # busy loop), a lease that expires, a recrawl round. Our own leases wake us on commit.
        candidates: Iterable[float | None] = (
            prog.next_ready_at,
            prog.next_lease_expiry,
            prog.next_refetch_at if self.recrawl else None,
        )
        soonest = min((t for t in candidates if t is not None), default=None)
        if (
            self.horizon is not None
            and not self.recrawl
            and self.in_flight == 0
            and prog.leased == 0
            and soonest is not None  # None: paused hosts or crawl; wait for the operator
            and soonest - now > self.horizon
        ):
            return Step(Action.HORIZON, until=soonest, revisits=revisits, reclaimed=reclaimed)
        wake_at = now + IDLE_POLL_MAX if soonest is None else soonest
        timeout = idle_timeout(wake_at, self.clock.time())
        return Step(Action.IDLE, timeout=timeout, revisits=revisits, reclaimed=reclaimed)

    def record(self, step: Step) -> None:
        """Account for the leases a step granted (on the thread that runs :meth:`plan`)."""
        n = len(step.leases)
        self.granted += n
        self.in_flight += n

    def settled(self, n: int) -> None:
        """``n`` leases were committed, or dropped (they expire or are reclaimed)."""
        self.in_flight -= n

    def step(self, idle: int) -> Step:
        """One whole decision, inline: :meth:`plan`, then :meth:`lease` and :meth:`record`
        when it calls for leases. What a caller without threads (the simulator) uses."""
        step = self.plan(idle)
        if step.action is Action.LEASE:
            step = self.lease(step.want, waiting=step.waiting)
            self.record(step)
        return step


class Feeder:
    """The engine's lease task around a :class:`FeederCore`; workers take their leases here.

    ``call`` runs the core's frontier half where the frontier's calls belong. ``stopped`` tells
    the loop to end (a signal, an archive failure); ``stop`` is how it ends the crawl itself
    (``max_pages``). On its way out it sends every worker the ``None`` that ends it.
    """

    def __init__(
        self,
        core: FeederCore,
        call: Call,
        clock: Clock,
        *,
        workers: int,
        summary: CrawlSummary,
        stopped: Callable[[], bool],
        stop: Callable[[str], None],
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.core = core
        self._call = call
        self._clock = clock
        self._workers = workers
        self._summary = summary
        self._stopped = stopped
        self._stop = stop
        self._progress = progress
        self._work: asyncio.Queue[Lease | None] = asyncio.Queue()
        self._wake = asyncio.Event()
        #: Workers waiting in :meth:`next_lease`.
        self.idle = 0

    def wake(self) -> None:
        """Decide again now (a worker went idle, a commit freed hosts, the crawl must stop)."""
        self._wake.set()

    def settled(self, n: int) -> None:
        """``n`` leases were committed: fewer in flight, and their hosts may be ready again."""
        self.core.settled(n)
        self._wake.set()

    async def next_lease(self) -> Lease | None:
        """A worker's next lease; None when the worker should end."""
        self.idle += 1
        self._wake.set()
        lease = await self._work.get()
        self.idle -= 1
        return lease

    async def run(self) -> None:
        core = self.core
        try:
            while not self._stopped():
                step = core.plan(self._idle_now(), busy(self._call))
                if step.action is Action.LEASE:
                    step = await self._call(core.lease, step.want, self._idle_now)
                    core.record(step)
                    self._summary.revisits_started += step.revisits
                    if step.reclaimed and self._progress:
                        self._progress(f"returned {step.reclaimed} leases of a dead crawl process")
                action = step.action
                if action is Action.LEASED:
                    # Paced leases first: the frontier gave no more of them than there were
                    # waiting workers, who take them now (a paced start must not wait).
                    for lease in step.leases:
                        if lease.paced:
                            self._work.put_nowait(lease)
                    for lease in step.leases:
                        if not lease.paced:
                            self._work.put_nowait(lease)
                    if step.timeout is not None:
                        await self._wait(step.timeout)
                elif action is Action.WAIT:
                    await self._wait(None)
                elif action is Action.LINGER:
                    await self._clock.sleep(step.timeout or 0.0)
                elif action is Action.IDLE:
                    await self._wait(step.timeout)
                elif action is Action.MAX_PAGES:
                    self._stop("max-pages")
                    break
                elif action is Action.HORIZON:
                    self._stop("horizon")
                    break
                else:
                    break  # FINISHED
        finally:
            for _ in range(self._workers):
                self._work.put_nowait(None)

    def _idle_now(self) -> int:
        """Workers without a lease (read on the frontier's thread: a plain int, and it can
        only grow while the loop awaits the lease call that reads it)."""
        return self.idle - self._work.qsize()

    async def _wait(self, timeout: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            await self._clock.wait_for(self._wake.wait(), timeout)
        self._wake.clear()
