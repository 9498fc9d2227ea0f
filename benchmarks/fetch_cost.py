"""Instructions per fetch of ``Fetcher.fetch`` against a bare aiohttp get, counted by valgrind.

    .venv/bin/python benchmarks/fetch_cost.py [--fetches 2000] [--tool fetcher|bare|both]

Serves the ``bench crawl`` site (10 hosts x 200 pages, nginx when installed) and fetches its
pages 64 at a time on uvloop, as the crawl does, under ``valgrind --tool=cachegrind
--cache-sim=no``: once 200 fetches and once 200 + N; the difference over N is what one fetch
costs, start-up excluded. ``fetcher`` is idemcrawl's ``Fetcher.fetch`` (SSRF checks, byte
limits, the total timeout, the exchange kept for the archive); ``bare`` a plain
``session.get`` + ``read()`` with aiohttp's defaults, what the bare crawler does.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONCURRENCY = 64


def fetch_all(tool: str, urls: list[str]) -> None:
    """Fetch every URL (64 in flight), checking each got its page."""
    import aiohttp
    import uvloop

    from idemcrawl.fetch import Fetcher, FetchSettings, parse_allow_list

    async def main() -> None:
        sem = asyncio.Semaphore(CONCURRENCY)
        if tool == "fetcher":
            settings = FetchSettings(allow_private=parse_allow_list(["127.0.0.1"]))
            async with Fetcher(settings, CONCURRENCY) as f:

                async def one(url: str) -> None:
                    async with sem:
                        res = await f.fetch(url)
                        assert res.status == 200 and res.body, url

                await asyncio.gather(*(one(u) for u in urls))
            return
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector) as s:

            async def bare(url: str) -> None:
                async with sem, s.get(url) as r:
                    body = await r.read()
                    assert r.status == 200 and body, url

            await asyncio.gather(*(bare(u) for u in urls))

    uvloop.run(main())


def count(tool: str, urls_file: Path, n: int) -> int:
    """User-space instructions of one run of ``n`` fetches."""
    out = subprocess.run(
        [
            "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
            sys.executable, __file__, "--run", tool, "--urls", str(urls_file), "--n", str(n),
        ],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out.stderr}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fetches", type=int, default=2000)
    ap.add_argument("--tool", choices=("fetcher", "bare", "both"), default="both")
    ap.add_argument("--run", choices=("fetcher", "bare"), help=argparse.SUPPRESS)
    ap.add_argument("--urls", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        urls = a.urls.read_text().split()
        fetch_all(a.run, [urls[i % len(urls)] for i in range(a.n)])
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    from idemcrawl.lab.bench.site import SiteSpec, StaticSite

    tools = ("fetcher", "bare") if a.tool == "both" else (a.tool,)
    with tempfile.TemporaryDirectory() as tmp, StaticSite(SiteSpec(hosts=10, pages=200)) as site:
        urls_file = Path(tmp) / "urls"
        urls = site.all_page_urls
        # host by host, interleaved, as a crawl spreads its fetches
        urls_file.write_text("\n".join(u for n in range(200) for u in urls[n::200]))
        for tool in tools:
            base = count(tool, urls_file, 200)
            more = count(tool, urls_file, 200 + a.fetches)
            print(f"{tool:8s} {(more - base) / a.fetches / 1e3:7.1f} k instructions per fetch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
