"""Where blocking calls run, and whether one is under way there (the feeder's hint)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from idemcrawl.engine.calls import busy, inline, on_thread


def test_a_thread_call_is_pending_from_submission_to_result() -> None:
    async def main() -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = on_thread(pool)
            assert not busy(call)
            release = threading.Event()
            first = asyncio.ensure_future(call(release.wait))
            second = asyncio.ensure_future(call(lambda: threading.current_thread().name))
            await asyncio.sleep(0.05)
            assert call.pending == 2 and busy(call)  # one running, one queued behind it
            release.set()
            await asyncio.gather(first, second)
            assert call.pending == 0 and not busy(call)
            assert not busy(inline)  # inline calls never wait for a thread

    asyncio.run(main())
