"""One host, side by side: idemcrawl with 8 in flight and no delay against Scrapy's defaults.

The article's shop (25 listings linking 500 products, 525 pages) on one loopback host that
answers in ``--latency-ms`` (10 ms, as in the kill test), crawled in turns (``--runs``) by:

* ``idemcrawl crawl SEED --delay 0 --host-concurrency 8`` (everything else default: the
  latency-adaptive gap, robots.txt, the archive), with the shop spider;
* Scrapy with its default settings (16 requests in flight, 8 per domain, no delay) and a spider
  that follows the same links and yields the same items.

Prints the wall seconds of each run and the medians. Run from the checkout::

    python benchmarks/shop_side_by_side.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from idemcrawl.lab.testsite import ShopConfig, ShopServer

SCRAPY_SPIDER = '''
import scrapy

class Shop(scrapy.Spider):
    name = "shop"

    def __init__(self, seed, **kw):
        super().__init__(**kw)
        self.start_urls = [seed]

    def parse(self, response):
        sku = response.css(".sku::text").get()
        if sku:
            yield {"sku": sku, "price": response.css(".price::text").get()}
        yield from response.follow_all(css="a")
'''


def run_idemcrawl(seed: str, work: Path, n: int) -> float:
    db = work / f"idem{n}.db"
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable, "-m", "idemcrawl", "crawl", seed, "--db", str(db),
            "--spider", "idemcrawl.lab.testsite.shop_spider:ShopSpider",
            "--allow-private", "127.0.0.1", "--delay", "0", "--host-concurrency", "8", "--quiet",
        ],
        check=True,
    )  # fmt: skip
    return time.perf_counter() - t0


def run_scrapy(seed: str, work: Path, n: int) -> float:
    spider = work / "scrapy_shop.py"
    spider.write_text(SCRAPY_SPIDER)
    out = work / f"scrapy{n}.jsonl"
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable, "-m", "scrapy", "runspider", str(spider), "-a", f"seed={seed}",
            "-o", str(out), "-s", "LOG_LEVEL=ERROR",
        ],
        check=True,
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    items = sum(1 for _ in out.open())
    if items != 500:
        raise SystemExit(f"scrapy stored {items} items, not 500")
    return elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--latency-ms", type=float, default=10.0)
    a = p.parse_args()
    times: dict[str, list[float]] = {"idemcrawl": [], "scrapy": []}
    with tempfile.TemporaryDirectory() as tmp, ShopServer(
        ShopConfig(latency_ms=a.latency_ms)
    ) as shop:
        work = Path(tmp)
        for n in range(a.runs):
            for tool, fn in (("idemcrawl", run_idemcrawl), ("scrapy", run_scrapy)):
                shop.reset()
                seconds = fn(shop.seed_url, work, n)
                requests = shop.stats()["total"]
                times[tool].append(seconds)
                print(f"run {n + 1} {tool:<9} {seconds:6.2f} s  {requests} requests", flush=True)
    medians = {tool: round(statistics.median(ts), 2) for tool, ts in times.items()}
    print(json.dumps({"median_seconds": medians, "runs": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
