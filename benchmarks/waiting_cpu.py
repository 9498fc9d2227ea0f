"""Waiting is free: CPU per page of a crawl at the default delay and of the same at delay 0.

The shop (``--listings`` x ``--per-page`` products behind their listings, one host, 10 ms
answers) is crawled twice into fresh databases: with every setting at its default (one request
at a time, one second between starts: the crawl mostly waits) and with ``--delay 0
--host-concurrency 8``. CPU is user + system time of the crawl and its parser processes
(``RUSAGE_CHILDREN``). Run from the checkout::

    python benchmarks/waiting_cpu.py            # 105 pages: about two minutes
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from idemcrawl.lab.testsite import ShopConfig, ShopServer


def crawl(seed: str, db: Path, *flags: str) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(
        [
            sys.executable, "-m", "idemcrawl", "crawl", seed, "--db", str(db),
            "--spider", "idemcrawl.lab.testsite.shop_spider:ShopSpider",
            "--allow-private", "127.0.0.1", "--quiet", *flags,
        ],
        check=True,
    )  # fmt: skip
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listings", type=int, default=5)
    p.add_argument("--per-page", type=int, default=20)
    a = p.parse_args()
    cfg = ShopConfig(listings=a.listings, per_page=a.per_page, latency_ms=10)
    pages = cfg.products + cfg.listings
    with tempfile.TemporaryDirectory() as tmp, ShopServer(cfg) as shop:
        work = Path(tmp)
        fast = crawl(shop.seed_url, work / "fast.db", "--delay", "0", "--host-concurrency", "8")
        shop.reset()
        polite = crawl(shop.seed_url, work / "polite.db")
    for run in (fast, polite):
        run["cpu_ms_per_page"] = round(1000 * run["cpu_s"] / pages, 2)
    ratio = polite["cpu_ms_per_page"] / fast["cpu_ms_per_page"]
    print(
        json.dumps(
            {"pages": pages, "delay_0": fast, "default_delay": polite, "ratio": round(ratio, 2)},
            indent=2,
        )
    )
    return 0 if ratio <= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
