"""The speed-of-light reference: what a crawl of the benchmark site costs with nothing extra.

No durability (the seen-set is a Python set), no robots.txt, no delays, no retries, no URL
normalisation beyond ``urljoin`` and dropping fragments; only the two concurrency caps every
crawler in the comparison gets (64 requests in flight, 8 per host) and the same HTML parser as
idemcrawl (selectolax/lexbor), run on the event loop (uvloop when installed, like idemcrawl).
Whatever idemcrawl spends beyond this is the price of being restart-safe and polite.

    python benchmarks/bare_crawler.py SEED_URL...   # prints {"pages", "items", "errors", ...}

Links are followed when they stay on a seed's origin (scheme://host:port).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urljoin

import aiohttp
from selectolax.lexbor import LexborHTMLParser

GLOBAL_CONCURRENCY = 64
HOST_CONCURRENCY = 8


def origin(url: str) -> str:
    """``scheme://host:port`` of an absolute URL: everything before the path."""
    end = url.find("/", url.find("//") + 2)
    return url if end < 0 else url[:end]


class BareCrawler:
    def __init__(self, seeds: list[str]) -> None:
        self.queues: dict[str, deque[str]] = {origin(s): deque() for s in seeds}
        self.active = dict.fromkeys(self.queues, 0)
        self.seen: set[str] = set()
        self.items: list[dict[str, str]] = []
        self.pages = self.errors = self.in_flight = 0
        self.done = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        for s in seeds:
            self.add(s)

    def add(self, url: str) -> None:
        if "#" in url:
            url = url[: url.index("#")]
        if url not in self.seen:
            queue = self.queues.get(origin(url))
            if queue is not None:  # out of scope, mailto:, javascript: ... have no queue
                self.seen.add(url)
                queue.append(url)

    def parse(self, url: str, body: bytes) -> None:
        tree = LexborHTMLParser(body)
        sku, price = tree.css_first("span.sku"), tree.css_first("span.price")
        if sku is not None:
            self.items.append(
                {"sku": sku.text(), "price": price.text() if price else "", "url": url}
            )
        base = origin(url)
        for node in tree.css("a[href]"):
            href = node.attributes.get("href")
            if not href:
                continue
            if href.startswith(("http://", "https://")):  # fast paths: no parsing at all
                self.add(href)
            elif href[0] == "/" and href[:2] != "//":
                self.add(base + href)
            else:
                self.add(urljoin(url, href))

    async def fetch(self, session: aiohttp.ClientSession, host: str, url: str) -> None:
        try:
            async with session.get(url, allow_redirects=False) as resp:
                body = await resp.read()
                if resp.status == 200 and resp.content_type == "text/html":
                    self.parse(url, body)
            self.pages += 1
        except (aiohttp.ClientError, TimeoutError):
            self.errors += 1
        finally:
            self.active[host] -= 1
            self.in_flight -= 1
            # Refill from here, not from a scheduler task: that task would only run after every
            # other ready callback (each a page parse), leaving slots empty meanwhile.
            self.dispatch(session)
            if self.in_flight == 0:
                self.done.set()

    def dispatch(self, session: aiohttp.ClientSession) -> None:
        for host, queue in self.queues.items():
            while queue and self.active[host] < HOST_CONCURRENCY:
                if self.in_flight >= GLOBAL_CONCURRENCY:
                    return
                self.active[host] += 1
                self.in_flight += 1
                task = asyncio.create_task(self.fetch(session, host, queue.popleft()))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=GLOBAL_CONCURRENCY, limit_per_host=HOST_CONCURRENCY)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()
        ) as session:
            self.dispatch(session)
            if self.in_flight:
                await self.done.wait()


async def main(seeds: list[str]) -> dict[str, float | int]:
    crawler = BareCrawler(seeds)
    start = time.perf_counter()
    await crawler.run()
    seconds = time.perf_counter() - start
    return {
        "pages": crawler.pages,
        "items": len(crawler.items),
        "errors": crawler.errors,
        "seconds": round(seconds, 3),
    }


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed, as idemcrawl uses it: the reference must not be handicapped."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python benchmarks/bare_crawler.py SEED_URL...")
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        print(json.dumps(runner.run(main(sys.argv[1:]))))
