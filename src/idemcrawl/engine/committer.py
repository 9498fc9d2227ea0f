"""Group commit: completions and failures written to the frontier in batches (R3, R5).

A batch is what arrived while the previous transaction ran, up to ``commit_batch``: under load
one transaction serves many pages, at low load every page is committed on its own, right away.
A batch may linger for more: ``commit_seconds`` when configured, else, while more completions
are moments away (the feeder says it is busy), COALESCE_SECONDS or twice what the last commit
took, whichever is longer (at most LINGER_MAX), else not at all — so the work a kill can lose
stays what was in flight, plus at most one bounded batch (published in the crawl's meta table by
the start-up reconciliation).

Why twice the last commit: a commit holds the frontier's thread, and a lease call that comes
meanwhile waits for it. Where a commit costs more (PostgreSQL: 13-16 ms for 40-60 pages in
``bench crawl``, against 4-6 ms on SQLite), waiting longer for a bigger batch keeps commits to
about a third of the thread's time under load, so idle workers wait less for their leases.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..frontier.base import Completion, Failure, Frontier, HostPolicy
from .calls import Call
from .clock import Clock
from .feeder import COALESCE_SECONDS
from .summary import CrawlSummary, Outcome

#: Under load a batch waits at most this long for more completions (see the module doc).
LINGER_MAX = 0.05


class Committer:
    """Workers :meth:`put` outcomes; :meth:`run` commits them until :meth:`close`.

    ``settled(n)`` hears of every committed batch (the feeder's in-flight account and wake-up);
    ``committed(completions, accepted)`` which completions the transaction accepted (the link
    gate's cache of committed URLs); ``checkpoint`` runs after both (the gate's periodic save).
    """

    def __init__(
        self,
        frontier: Frontier,
        call: Call,
        clock: Clock,
        policy: HostPolicy,
        summary: CrawlSummary,
        *,
        batch: int,
        linger: float,
        queue_size: int,
        busy: Callable[[], bool],
        settled: Callable[[int], None],
        checkpoint: Callable[[], Awaitable[None]] | None = None,
        committed: Callable[[list[Completion], list[bool]], None] | None = None,
    ) -> None:
        self._frontier = frontier
        self._call = call
        self._clock = clock
        self._policy = policy
        self._summary = summary
        self._batch = batch
        self._linger = linger
        self._busy = busy
        self._settled = settled
        self._checkpoint = checkpoint
        self._committed = committed
        #: Seconds the last commit took (the busy linger's measure).
        self._last_seconds = 0.0
        # Bounded: when commits fall behind, workers wait here instead of fetching more.
        self._queue: asyncio.Queue[Outcome | None] = asyncio.Queue(maxsize=queue_size)

    async def put(self, outcome: Outcome) -> None:
        await self._queue.put(outcome)

    async def close(self) -> None:
        """Commit what is queued, then end :meth:`run`."""
        await self._queue.put(None)

    async def run(self) -> None:
        done = False
        while not done:
            batch, done = await self.next_batch()
            if batch:
                await self.commit(batch)

    async def next_batch(self) -> tuple[list[Outcome], bool]:
        """The next batch, and whether :meth:`close` was reached."""
        q = self._queue
        first = await q.get()
        if first is None:
            return [], True
        batch: list[Outcome] = [first]
        linger = self._linger
        if not linger and self._busy():
            # Busy: more completions are moments away.
            linger = min(max(COALESCE_SECONDS, 2 * self._last_seconds), LINGER_MAX)
        clock = self._clock
        deadline = clock.monotonic() + linger
        while len(batch) < self._batch:
            if q.empty():
                left = deadline - clock.monotonic()
                if left <= 0:
                    break
                try:
                    nxt = await clock.wait_for(q.get(), left)
                except TimeoutError:
                    break
            else:
                nxt = q.get_nowait()
            if nxt is None:
                return batch, True
            batch.append(nxt)
        return batch, False

    async def commit(self, batch: list[Outcome]) -> None:
        """One transaction for the batch; each outcome is still accepted or rejected alone."""
        completions = [o for o in batch if isinstance(o, Completion)]
        failures = [o for o in batch if isinstance(o, Failure)]
        f, policy, clock = self._frontier, self._policy, self._clock
        t = clock.monotonic()

        def write() -> tuple[list[bool], list[bool]]:
            now = clock.time()
            started = clock.monotonic()  # on the frontier's thread: the commit's own time
            done = f.complete(completions, now, policy), f.fail(failures, now, policy)
            self._last_seconds = clock.monotonic() - started
            return done

        ok_c, ok_f = await self._call(write)
        s = self._summary
        s.commit_batches += 1
        s.commit_max_batch = max(s.commit_max_batch, len(batch))
        s.commit_max_seconds = max(s.commit_max_seconds, clock.monotonic() - t)
        s.committed += sum(ok_c) + sum(ok_f)
        s.completed += sum(ok_c)
        s.rejected_completions += ok_c.count(False) + ok_f.count(False)
        s.records += sum(len(c.records) for c, ok in zip(completions, ok_c, strict=True) if ok)
        s.failed += sum(
            1 for x, ok in zip(failures, ok_f, strict=True) if ok and x.retry_at is None
        )
        if self._committed is not None:
            self._committed(completions, ok_c)
        self._settled(len(batch))
        if self._checkpoint is not None:
            await self._checkpoint()
