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
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Call(Protocol):
    """Run ``fn(*args)`` where its owner's blocking calls belong; await its result."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


#: The interpreter's GIL switch interval while a crawl runs its SQL and WARC threads, in
#: seconds (CPython's default is 0.005). The event loop releases the GIL at every system call
#: (each socket send, each pipe write to a parser process); when a thread is running Python
#: meanwhile, the loop waits for it up to this long before it may force a switch, and py-spy
#: showed the loop's socket sends as its top "busy" line for exactly that reason.
#: ``IDEMCRAWL_GIL_SWITCH`` (seconds) overrides it, for comparisons.
GIL_SWITCH_SECONDS = 0.0005


@contextlib.contextmanager
def quick_gil_switch() -> Iterator[None]:
    """Run the block with :data:`GIL_SWITCH_SECONDS` as the switch interval, then restore it
    (the interval is the whole process's: the engine owns it while its threads run)."""
    raw = os.environ.get("IDEMCRAWL_GIL_SWITCH", "")
    try:
        wanted = float(raw) if raw else GIL_SWITCH_SECONDS
    except ValueError:
        wanted = -1.0
    if not 0 < wanted <= 1:
        raise ValueError(f"IDEMCRAWL_GIL_SWITCH must be seconds in (0, 1], got {raw!r}")
    before = sys.getswitchinterval()
    sys.setswitchinterval(wanted)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def on_thread(executor: concurrent.futures.Executor | None) -> Call:
    """Calls run on ``executor`` (None: the loop's default executor)."""

    async def call(fn: Callable[..., T], /, *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    return call


async def inline(fn: Callable[..., T], /, *args: Any) -> T:
    """Calls run on the event loop's own thread: only for objects that never block."""
    return fn(*args)
