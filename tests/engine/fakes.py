"""Test doubles for the engine's injected parts: a virtual clock and a fetcher without network.

Both are real implementations of the engine's interfaces (``engine.Clock``,
``engine.PageFetcher``), so the parts under test run their real code paths; only time and the
network are simulated.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Awaitable
from typing import Any, TypeVar

from idemcrawl.fetch import FetchError, FetchResult

T = TypeVar("T")


async def settle(rounds: int = 50) -> None:
    """Let every task that can run without time passing run (no threads are involved)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class FakeClock:
    """Virtual time: nothing sleeps; :meth:`advance` moves time and fires what came due.

    Timers fire in deadline order, each at its own moment (``now`` is the timer's deadline
    while the tasks it wakes run), so a task that looks at the clock when it wakes sees the
    time it asked to wake at. ``waits`` records every timeout asked for.
    """

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self._origin = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.waits: list[float] = []

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return 50.0 + self.now - self._origin

    def _timer(self, seconds: float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + max(seconds, 0.0), next(self._seq), fut))
        return fut

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        await self._timer(seconds)

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        if timeout is None:
            return await aw
        self.waits.append(timeout)
        task = asyncio.ensure_future(aw)
        timer = self._timer(timeout)
        try:
            await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():
            raise TimeoutError
        return task.result()

    @property
    def deadlines(self) -> list[float]:
        """When the timers still pending fire (virtual time)."""
        return sorted(when for when, _, fut in self._timers if not fut.done())

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass."""
        target = self.now + seconds
        await settle()
        while self._timers and self._timers[0][0] <= target:
            when, _, fut = heapq.heappop(self._timers)
            if fut.done():
                continue  # cancelled: its waiter moved on
            self.now = max(self.now, when)
            fut.set_result(None)
            await settle()
        self.now = target
        await settle()


def response(
    url: str,
    status: int = 200,
    body: bytes | str = b"",
    headers: dict[str, str] | None = None,
    *,
    elapsed: float = 0.01,
    cut_reason: str | None = None,
) -> FetchResult:
    """A FetchResult as the real fetcher builds it (lower-cased header names)."""
    data = body.encode() if isinstance(body, str) else body
    hdrs = {"content-type": "text/html; charset=utf-8", **(headers or {})}
    return FetchResult(
        url=url,
        status=status,
        headers={k.lower(): v for k, v in hdrs.items()},
        body=data,
        elapsed=elapsed,
        wire_bytes=len(data),
        cut_reason=cut_reason,
        reason="OK" if status == 200 else "",
        raw_headers=list(hdrs.items()),
        request_headers=[("User-Agent", "test")],
        ip="127.0.0.1",
    )


Answer = FetchResult | FetchError


class FakeFetcher:
    """Canned answers by URL, no network. A list answers in turn (its last answer repeats);
    an unknown URL gets a 404. ``calls`` lists (url, headers) of every fetch, in order;
    ``methods`` (method, body) of each."""

    def __init__(self, routes: dict[str, Answer | list[Answer]] | None = None) -> None:
        self.routes: dict[str, Answer | list[Answer]] = dict(routes or {})
        self.calls: list[tuple[str, Any]] = []
        self.methods: list[tuple[str, bytes | None]] = []

    async def fetch(
        self,
        url: str,
        headers: dict[str, str] | list[tuple[str, str]] | None = None,
        *,
        method: str = "GET",
        body: bytes | None = None,
    ) -> FetchResult:
        self.calls.append((url, headers))
        self.methods.append((method, body))
        await asyncio.sleep(0)  # a real fetch yields to the loop
        answer = self.routes.get(url)
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        if answer is None:
            return response(url, 404, "not found", {"content-type": "text/plain"})
        if isinstance(answer, FetchError):
            raise answer
        return answer

    @property
    def urls(self) -> list[str]:
        return [url for url, _ in self.calls]


class Spy:
    """A frontier that counts the calls made to it and forwards them."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kw: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kw)

        return counted
