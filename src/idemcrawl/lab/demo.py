"""``idemcrawl demo``: start the built-in shop, crawl it with the shop spider, check every record.

The check is the article's promise made visible: exactly one stored record per product, each
equal to what the page shows, however often the demo was killed and rerun on the same database
(a rerun on the same port resumes the same crawl). The command line only prints the result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from idemcrawl.config import CrawlConfig
from idemcrawl.engine import run_crawl
from idemcrawl.fetch import parse_allow_list
from idemcrawl.frontier import open_frontier
from idemcrawl.lab.testsite import ShopConfig, ShopServer, expected_products

__all__ = ["DemoResult", "run_demo"]

SPIDER = "idemcrawl.lab.testsite.shop_spider:ShopSpider"


@dataclass(frozen=True)
class DemoResult:
    """What the demo stored and how it compares with the shop's own catalogue."""

    seed_url: str
    #: The stored records in key order: ``key``, ``url`` and the decoded ``data``.
    records: list[dict[str, Any]]
    #: The shop's catalogue: SKU -> price, as the pages show it.
    expected: dict[str, Any]
    #: Stored records whose price equals the catalogue's.
    correct: int
    #: Fetches this run made, and requests the shop saw (robots.txt included).
    fetched: int
    requests: int

    @property
    def ok(self) -> bool:
        """Every product stored exactly once, each with the price the page shows."""
        return self.correct == len(self.expected) == len(self.records)


def run_demo(
    db: str,
    listings: int,
    per_page: int,
    port: int,
    log: Callable[[str], None] | None = None,
) -> DemoResult:
    """Serve the shop on loopback ``port`` (a free one if it is busy), crawl it into ``db``.

    Runs the crawl with signal handling on, so Ctrl-C stops it cleanly and a rerun resumes.
    """
    shop = ShopConfig(listings, per_page)
    server = ShopServer(shop, port=port)
    try:
        server.start()
    except (OSError, RuntimeError):
        server = ShopServer(shop).start()
    try:
        seed_url = server.seed_url
        if log is not None:
            log(f"test shop at {seed_url}; crawling into {db}")
        summary = run_crawl(
            CrawlConfig(
                db=db,
                seeds=(seed_url,),
                spider=SPIDER,
                concurrency=8,
                host_concurrency=4,
                delay=0.0,
                allow_private=parse_allow_list(["127.0.0.1"]),
            ),
            handle_signals=True,
        )
        requests = server.stats()["total"]
    finally:
        server.stop()
    f = open_frontier(db, create=False)
    try:
        rows = [
            {"key": r["key"], "url": r["url"], "data": json.loads(r["data"])} for r in f.records()
        ]
    finally:
        f.close()
    expected = expected_products(shop)
    correct = sum(1 for r in rows if r["data"].get("price") == expected.get(r["key"]))
    return DemoResult(
        seed_url=seed_url,
        records=rows,
        expected=expected,
        correct=correct,
        fetched=summary.fetched,
        requests=requests,
    )
