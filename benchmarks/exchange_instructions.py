"""Instructions per bench page of building its WARC exchange in a parser process (valgrind).

    .venv/bin/python benchmarks/exchange_instructions.py [--pages 500] [--sides build,worker]
        [--python] [--tool cachegrind|callgrind] [--keep DIR]

Two sides, each run under valgrind twice (50 and 50 + N pages) and the difference over N
printed, so start-up cancels out and the figure does not move with the machine's load:

* ``build``: ``warc_records.build_page_exchange`` of a bench page (3 hosts x 400 pages, ~15 KB,
  40 links), with the spec a crawl sends: the request headers aiohttp sent, nginx's response
  headers as received bytes, the fetch facts;
* ``worker``: a parser process's whole per-page work with the archive on: unpickle the job
  (with its spec), parse, build the exchange, pickle the result;
* ``crawl`` and ``crawl0``: the crawl process's side of a page with the archive on
  (``Archiver.exchange_spec``, pickle the job with it, unpickle the result with its exchange,
  ``Archiver.archive``: the dedup check and the append to a WARC file in a temporary
  directory) and without it (the job and the result alone): their difference is what the
  archive costs the crawl process per page, besides its SQL (the ``bodies`` row).

``--python`` builds with the pure-Python records (``warc_records._native`` set to None), the
reference the C builder (``idemcrawl._warc``) replaces; without the extension (an older
checkout) both are the same. ``--cpu ROUNDS`` times ``build`` instead (CPU time, no valgrind,
so SHA-NI and AVX-512 count as they run): native and Python rounds of 1,000 builds
interleaved in one process, a side figure on a shared machine. Written for issue 17 (the
archive's instructions per page); valgrind hides SHA-NI and AVX-512, so SHA-1 and ISA-L are
counted in their generic code.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SIDES = ("build", "worker", "crawl", "crawl0")
#: Distinct bench pages built in turn, the same number in both runs of a pair.
JOBS = 200
#: Pages of the crawl sides: distinct bodies (none becomes a revisit), the same in both runs.
MAX_PAGES = 1_000
PORTS = [40000, 40001, 40002]
REQUEST = [
    ("Host", "127.0.0.1:40000"),
    ("User-Agent", "idemcrawl/0.1 (+https://example.org/bot)"),
    ("Accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8"),
    ("Accept-Encoding", "gzip, deflate, br"),
    ("Accept-Language", "en"),
]


def _response(n: int) -> tuple[tuple[bytes, bytes], ...]:
    return (
        (b"Server", b"nginx/1.22.1"),
        (b"Date", b"Wed, 02 Dec 2026 18:30:00 GMT"),
        (b"Content-Type", b"text/html"),
        (b"Last-Modified", b"Wed, 02 Dec 2026 18:00:00 GMT"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Connection", b"keep-alive"),
        (b"ETag", f'W/"6750f0c0-{n:x}"'.encode()),
        (b"Content-Encoding", b"gzip"),
    )


def _spec(n: int) -> Any:
    from idemcrawl.warc_records import ExchangeSpec

    metadata = {
        "url_version": 1, "status": 200, "elapsed_s": 0.003141, "wire_bytes": 4321,
        "cut_reason": None,
    }  # fmt: skip
    return ExchangeSpec(1_796_000_000.0 + n / 7, list(REQUEST), "OK", "1.1", _response(n),
                        "127.0.0.1", metadata, True, None, "GET", b"", 1, False)  # fmt: skip


def _pages(n: int) -> list[tuple[str, bytes]]:
    from idemcrawl.lab.bench.site import SiteSpec, page_html, page_url

    site = SiteSpec(hosts=3, pages=400)
    return [
        (page_url(PORTS[i % 3], i), page_html(site, PORTS, i % 3, i).encode()) for i in range(n)
    ]


def run_side(side: str, n: int, python: bool) -> None:
    from idemcrawl import parse, warc_records

    if python:
        warc_records._native = None  # type: ignore[attr-defined]
        warc_records.digest_of_sha1 = getattr(  # type: ignore[misc]
            warc_records, "_digest_of_sha1_py", warc_records.digest_of_sha1
        )
    pages = _pages(JOBS)
    specs = [_spec(i) for i in range(JOBS)]
    links = [[f"{url}/l{k}" for k in range(40)] for url, _ in pages]
    if side == "build":
        build = warc_records.build_page_exchange
        for i in range(n):
            url, body = pages[i % JOBS]
            build(specs[i % JOBS], url, 200, body, links=links[i % JOBS], records=1,
                  parse_error=None)  # fmt: skip
        return
    from idemcrawl.frontier.base import PAGE
    from idemcrawl.parse import ParseJob

    if side.startswith("crawl"):
        crawl_side(side == "crawl", n, pages)
        return
    scope = frozenset(f"http://127.0.0.1:{p}" for p in PORTS)
    parse.init_worker("idemcrawl.lab.bench.crawl:BenchSpider", scope, "host")
    headers = {"content-type": "text/html; charset=utf-8"}
    jobs = [
        pickle.dumps(
            ParseJob(url, 200, headers, body, 1, PAGE, None, specs[i]), pickle.HIGHEST_PROTOCOL
        )
        for i, (url, body) in enumerate(pages)
    ]
    dumps, loads = pickle.dumps, pickle.loads
    for i in range(n):
        result = parse.parse_in_worker(loads(jobs[i % JOBS]))
        assert result.warc is not None
        dumps(result, pickle.HIGHEST_PROTOCOL)


def crawl_side(archive: bool, n: int, pages: list[tuple[str, bytes]]) -> None:
    """The crawl process's per-page share (see the module docstring); ``MAX_PAGES`` distinct
    bodies made in both runs of a pair, so that no page becomes a revisit."""
    import asyncio
    import atexit
    import tempfile

    from idemcrawl.dedup import BloomNegativeCache
    from idemcrawl.engine.archiver import Archiver
    from idemcrawl.engine.calls import inline
    from idemcrawl.fetch import FetchResult
    from idemcrawl.frontier.base import PAGE, Lease
    from idemcrawl.parse import ParseJob, ParseResult
    from idemcrawl.warc import WarcStore
    from idemcrawl.warc_records import build_page_exchange

    class Clock:
        def time(self) -> float:
            return 1_796_000_000.0

    class Frontier:
        def find_bodies(self, digests: Any) -> dict[str, Any]:
            return {}

    tmp = tempfile.mkdtemp(prefix="exchange-instructions-")
    atexit.register(shutil.rmtree, tmp, True)
    store = WarcStore(tmp, "slot00")
    archiver = Archiver(
        store, tmp, write=inline, call=inline, frontier=Frontier(), clock=Clock(),  # type: ignore[arg-type]
        bodies=BloomNegativeCache(100_000), on_fatal=print, append=inline,
    )  # fmt: skip
    fetched, leases, results = [], [], []
    for i in range(MAX_PAGES):
        url, body = pages[i % JOBS]
        body += str(i).encode()
        res = FetchResult(url, 200, {"content-type": "text/html"}, body, 0.01, wire_bytes=4321,
                          reason="OK", http_version="1.1", request_headers=list(REQUEST),
                          ip="127.0.0.1", wire_headers=_response(i))  # fmt: skip
        lease = Lease(i, url, f"http://127.0.0.1:{PORTS[0]}", 1, 1, "slot00", 0.0, 1, 0)
        result = ParseResult()
        if archive:
            spec = archiver.exchange_spec(lease, res, links_cut=False)
            assert spec is not None
            result.warc = build_page_exchange(
                spec, url, 200, body, links=[], records=1, parse_error=None
            )
        fetched.append(res)
        leases.append(lease)
        results.append(pickle.dumps(result, pickle.HIGHEST_PROTOCOL))

    async def pages_of_the_crawl() -> None:
        dumps, loads = pickle.dumps, pickle.loads
        for i in range(n):
            lease, res = leases[i], fetched[i]
            spec = archiver.exchange_spec(lease, res, links_cut=False) if archive else None
            job = ParseJob(res.url, 200, res.headers, res.body, 1, PAGE, None, spec)
            dumps(job, pickle.HIGHEST_PROTOCOL)
            result = loads(results[i])
            if archive:
                await archiver.archive(lease, res, result, ())

    asyncio.run(pages_of_the_crawl())


def cpu_rounds(rounds: int) -> None:
    """Per-build CPU time of the native and the Python builder, rounds interleaved."""
    import time

    from idemcrawl import warc_records

    native, digest = warc_records._native, warc_records.digest_of_sha1  # type: ignore[attr-defined]
    pages = _pages(JOBS)
    specs = [_spec(i) for i in range(JOBS)]
    links = [[f"{url}/l{k}" for k in range(40)] for url, _ in pages]
    build = warc_records.build_page_exchange
    times: dict[str, list[float]] = {"native": [], "python": []}
    for r in range(2 * rounds):
        kind = ("native", "python")[r % 2]
        warc_records._native = native if kind == "native" else None  # type: ignore[attr-defined]
        warc_records.digest_of_sha1 = (  # type: ignore[misc]
            digest if kind == "native" else warc_records._digest_of_sha1_py  # type: ignore[attr-defined]
        )
        t = time.process_time()
        for i in range(1000):
            url, body = pages[i % JOBS]
            build(specs[i % JOBS], url, 200, body, links=links[i % JOBS], records=1,
                  parse_error=None)  # fmt: skip
        times[kind].append((time.process_time() - t) * 1e3)  # us per build
    for kind, us in times.items():
        print(
            f"{kind:7s} " + " ".join(f"{x:.0f}" for x in us) + f" us per build (min {min(us):.0f})"
        )


def count(tool: str, side: str, n: int, python: bool, workdir: Path) -> int:
    from idemcrawl.lab.bench.instructions import valgrind_count  # not in the counted runs

    argv = [sys.executable, __file__, "--side", side, "--n", str(n)]
    out = workdir / f"{tool}.{side}.{'py' if python else 'c'}.{n}"
    return valgrind_count([*argv, *(["--python"] if python else [])], out, tool)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=500)
    ap.add_argument("--tool", choices=("cachegrind", "callgrind"), default="cachegrind")
    ap.add_argument("--keep", type=Path, help="directory to keep the valgrind files in")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--python", action="store_true", help="the pure-Python record builder")
    ap.add_argument("--cpu", type=int, metavar="ROUNDS", help="time builds instead (CPU)")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        run_side(a.side, a.n, a.python)
        return 0
    if a.cpu:
        cpu_rounds(a.cpu)
        return 0
    if 50 + a.pages > MAX_PAGES and any(x.startswith("crawl") for x in a.sides.split(",")):
        ap.error(
            f"the crawl sides have {MAX_PAGES} distinct pages: --pages {MAX_PAGES - 50} at most"
        )
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for side in a.sides.split(","):
            base = count(a.tool, side, 50, a.python, work)
            more = count(a.tool, side, 50 + a.pages, a.python, work)
            print(f"{side:8s} {(more - base) / a.pages / 1e3:8.1f} k instructions per page")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
