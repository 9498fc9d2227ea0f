"""The benchmark crawl written as a Scrapy user would write it, for a side-by-side with idemcrawl.

Standalone (prints a JSON summary: pages, items, requests, seconds)::

    python benchmarks/scrapy_spider.py [--items OUT.jsonl] SEED_URL...

or with Scrapy's own runner::

    scrapy runspider benchmarks/scrapy_spider.py -a seeds=URL1,URL2 -o items.jsonl

Settings match what idemcrawl and the bare crawler get: 64 requests in flight, 8 per host, no
delay, robots.txt obeyed, items exported as JSON lines (to /dev/null unless ``--items``).

Per-host concurrency, the one setting without a direct equivalent: Scrapy applies
``CONCURRENT_REQUESTS_PER_DOMAIN`` per *download slot*, and the default slot key is the
hostname without the port. The benchmark's hosts are all 127.0.0.1 on different ports, so they
would share one slot and Scrapy would crawl the 50 hosts with 8 requests in flight in total.
Every request therefore carries ``meta["download_slot"] = "host:port"`` (set by the spider for
the requests it makes and by :class:`PortSlotMiddleware` for the robots.txt requests Scrapy
makes itself), which gives each port its own slot of 8: the same cap, on the same notion of a
host (idemcrawl's ``host_key`` includes the port). ``CONCURRENT_REQUESTS_PER_IP`` keeps its
default 0 (it is deprecated since Scrapy 2.13; non-zero would key slots by IP and merge the
ports again). The scheduler queue is ``DownloaderAwarePriorityQueue`` (the default since Scrapy
2.13, set explicitly for older versions), which dequeues from the least busy slot, as
Scrapy's broad-crawl guide recommends; with the old default queue, a depth-first run on one
slot can fill all 64 places with requests for one host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.http import Request, Response


def slot_of(url: str) -> str:
    """The download slot of a URL: host and port, like idemcrawl's host_key."""
    return urlsplit(url).netloc


class PortSlotMiddleware:
    """Give requests made without a slot (robots.txt ones) the host:port slot too."""

    def process_request(self, request: Request, spider: Any = None) -> None:
        request.meta.setdefault("download_slot", slot_of(request.url))


SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 64,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
    "DOWNLOAD_DELAY": 0,
    "ROBOTSTXT_OBEY": True,
    "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False,
    "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue",
    "DOWNLOADER_MIDDLEWARES": {PortSlotMiddleware: 50},
    "USER_AGENT": "scrapy-bench (+https://scrapy.org)",
    "HTTPPROXY_ENABLED": False,  # loopback only, whatever http_proxy says
}


class BenchSpider(scrapy.Spider):
    name = "bench"
    allowed_domains = ["127.0.0.1"]
    custom_settings = SETTINGS

    def __init__(self, seeds: str = "", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seeds = [s for s in seeds.split(",") if s]

    async def start(self) -> AsyncIterator[Request]:
        for request in self.start_requests():
            yield request

    def start_requests(self) -> Iterator[Request]:  # Scrapy < 2.13 calls this instead
        for url in self.seeds:
            yield Request(url, meta={"download_slot": slot_of(url)})

    def parse(self, response: Response) -> Iterator[dict[str, str | None] | Request]:
        sku = response.css("span.sku::text").get()
        if sku is not None:
            yield {"sku": sku, "price": response.css("span.price::text").get(), "url": response.url}
        # Each URL once per page, as idemcrawl's page.links() and LinkExtractor(unique=True) do.
        urls = dict.fromkeys(response.urljoin(h) for h in response.css("a::attr(href)").getall())
        for url in urls:
            if url.startswith(("http://", "https://")):  # not mailto:, javascript: ...
                yield Request(url, meta={"download_slot": slot_of(url)})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--items", default=os.devnull, help="JSON lines output (default: discard)")
    ap.add_argument("seeds", nargs="+")
    a = ap.parse_args(argv)
    feed = Path(a.items).resolve().as_uri()
    process = CrawlerProcess(settings={"FEEDS": {feed: {"format": "jsonlines"}}})
    crawler = process.create_crawler(BenchSpider)
    process.crawl(crawler, seeds=",".join(a.seeds))
    start = time.perf_counter()
    process.start()
    seconds = time.perf_counter() - start
    stats = crawler.stats.get_stats() if crawler.stats else {}
    summary = {
        "pages": stats.get("response_received_count", 0),
        "items": stats.get("item_scraped_count", 0),
        "requests": stats.get("downloader/request_count", 0),
        "errors": stats.get("log_count/ERROR", 0),
        "seconds": round(seconds, 3),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
