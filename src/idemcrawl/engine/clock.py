"""Time, injected: every time the engine reads or waits goes through one :class:`Clock`.

Why: politeness, lease expiry, retry back-off, commit lingering and the feeder's wake-ups are all
decisions about time. With the clock passed in, a test (or the virtual-clock simulator) can make
an hour pass in a microsecond and check those decisions exactly, without sleeping.

Two readings, on purpose: ``time()`` is wall-clock UNIX seconds, the only kind the frontier stores
(due times, lease expiry, fetch times), shared by every process of a crawl; ``monotonic()`` is
for durations and deadlines inside this process, which must not jump when the wall clock does.
"""

from __future__ import annotations

import asyncio
import time as _time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

T = TypeVar("T")


class WallClock(Protocol):
    """The one reading the feeder's synchronous core needs (the simulator supplies just this)."""

    def time(self) -> float:
        """Wall-clock UNIX seconds: what the frontier stores and compares."""
        ...


class Clock(WallClock, Protocol):
    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for durations and in-process deadlines."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of this clock's time pass."""
        ...

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        """``aw``'s result, or TimeoutError once ``timeout`` seconds of this clock have passed
        (the waited-for work is then cancelled); None waits as long as it takes.

        Part of the clock because every timed wait in the engine (the feeder's wake-up, the
        committer's linger) races an event against this clock's time, not the machine's.
        """
        ...


class SystemClock:
    """The machine's clocks and asyncio's timers: the engine's default.

    The readings are the C functions themselves (no Python frame per call): the engine reads the
    time a few times per page.
    """

    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        return await asyncio.wait_for(aw, timeout)
