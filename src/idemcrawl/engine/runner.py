"""Running a crawl from synchronous code: the event loop, and what SIGINT/SIGTERM mean."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import Callable
from typing import Any

from aiohttp.abc import AbstractResolver

from ..config import CrawlConfig
from .engine import Engine
from .summary import CrawlSummary


def run_crawl(
    config: CrawlConfig,
    *,
    resolver: AbstractResolver | None = None,
    progress: Callable[[str], None] | None = None,
    snapshot: Callable[[dict[str, Any]], None] | None = None,
    handle_signals: bool = False,
    freeze_startup: bool = False,
) -> CrawlSummary:
    """Run one crawl process to its end (or until a signal / ``max_pages``).

    ``progress`` receives one-off messages (and, without ``snapshot``, a status line every
    2 s); ``snapshot`` receives the live numbers every 2 s (``progress.ProgressDisplay.update``).
    With ``handle_signals``, the first SIGINT/SIGTERM stops leasing and lets the pages in flight
    finish and commit; a second one cancels the crawl at once (leases then simply expire).
    ``freeze_startup`` (the ``crawl`` command, whose process is the crawl's alone) calls
    :func:`freeze_startup_objects` before the loop starts; a library caller's objects are its own.
    """
    engine = Engine(config, resolver=resolver, progress=progress, snapshot=snapshot)

    async def main() -> CrawlSummary:
        if handle_signals:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            hits = {"n": 0}

            def on_signal(name: str) -> None:
                hits["n"] += 1
                if hits["n"] == 1:
                    engine.stop(name)
                elif task is not None:
                    task.cancel()

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, on_signal, sig.name)
        return await engine.run()

    if freeze_startup:
        freeze_startup_objects()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main())


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, classes, functions: start-up's ~10^5 container
    objects) out of the cyclic garbage collector's reach for the rest of the process.

    They live until the process exits, yet the collections that the crawl's per-page objects
    (futures, fetch results, completions waiting for a commit) trigger walked them again and
    again: -46 k of the crawl process's 1.61 M instructions per bench page (valgrind, 2,000
    against 200 pages; docs/benchmarks.md). Reference counting still frees them as usual; only
    cycles among them would never be collected, and start-up leaves none that matter.
    """
    gc.collect()
    gc.freeze()


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (optional ``fast`` extra): less CPU per request and callback.

    ``IDEMCRAWL_UVLOOP=0`` keeps the standard loop (for comparisons and debugging).
    """
    if os.environ.get("IDEMCRAWL_UVLOOP", "1") == "0":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
