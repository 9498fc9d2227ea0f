"""Group commit: completions and failures written to the frontier in batches (R3, R5).

A batch is what arrived while the previous transaction ran, up to ``commit_batch``: under load
one transaction serves many pages, at low load every page is committed on its own, right away.
A batch may linger for more: ``commit_seconds`` when configured, else COALESCE_SECONDS while more
completions are moments away (the feeder says it is busy), else not at all — so the work a kill
can lose stays what was in flight, plus at most one bounded batch (published in the crawl's meta
table by the start-up reconciliation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..frontier.base import Completion, Failure, Frontier, HostPolicy
from .calls import Call
from .clock import Clock
from .feeder import COALESCE_SECONDS
from .summary import CrawlSummary, Outcome


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
            linger = COALESCE_SECONDS  # busy: more completions are moments away
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
            return f.complete(completions, now, policy), f.fail(failures, now, policy)

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
