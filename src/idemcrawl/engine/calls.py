"""Where blocking calls run: on a dedicated thread, or inline for objects that never block.

The frontier and the WARC store are synchronous. A SQL frontier blocks on disk and network, so
its calls go to one dedicated thread (one connection, used by one thread at a time, and the
event loop never waits on SQL); the WARC store compresses and writes on a thread of its own. A
frontier that never blocks (in memory) may be called inline instead, which saves the two thread
hand-offs per call. The parts of the engine take a :class:`Call` and do not know which it is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Call(Protocol):
    """Run ``fn(*args)`` where its owner's blocking calls belong; await its result."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


class OnThread:
    """A :class:`Call` whose calls run on ``executor`` (None: the loop's default executor).

    ``pending`` counts the calls submitted and not yet finished: the feeder need not wait for
    more idle workers before a lease call that would queue behind another call anyway.
    """

    def __init__(self, executor: concurrent.futures.Executor | None) -> None:
        self._executor = executor
        self.pending = 0

    async def __call__(self, fn: Callable[..., T], /, *args: Any) -> T:
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self.pending -= 1


def on_thread(executor: concurrent.futures.Executor | None) -> OnThread:
    """Calls run on ``executor`` (None: the loop's default executor)."""
    return OnThread(executor)


def busy(call: Call) -> bool:
    """Whether a call is running or waiting where ``call`` runs them (never, inline)."""
    return isinstance(call, OnThread) and call.pending > 0


async def inline(fn: Callable[..., T], /, *args: Any) -> T:
    """Calls run on the event loop's own thread: only for objects that never block."""
    return fn(*args)
