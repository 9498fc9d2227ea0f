"""The lab's commands: ``testsite``, ``demo``, ``chaos``, ``bench`` and ``sim``.

They are tools around the crawler (test sites, a demonstration, the kill test, benchmarks, the
simulator), not the crawler, so their options and their printing live here with them; the
command line mounts them under ``idemcrawl`` with :func:`add_parsers`, :data:`COMMANDS` and
:func:`run_own_parser`. The tools themselves are imported inside each command, so mounting them
costs a crawl's start-up nothing.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from idemcrawl.argtypes import UsageError, count, non_negative_int, positive, seconds

__all__ = ["COMMANDS", "add_parsers", "run_own_parser"]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def add_parsers(sub: Any) -> None:
    """Add the lab's commands to the ``idemcrawl`` sub-command parsers ``sub``."""
    t = sub.add_parser(
        "testsite",
        help="serve a built-in test site",
        description="Serve a built-in test site on loopback. 'shop' is the article's shop "
        "(listing pages linking products; request counts at /__stats). 'politeness' serves four "
        "hosts, one port each: a and b with robots rules (a also answers 429/503/500 on some "
        "pages), c with robots Crawl-delay 1, d whose robots.txt answers 500; the request log "
        "(host, path, start, end) of all of them is at /__log. 'sandbox' is the scraping "
        "sandbox the examples/ spiders scrape: a paginated catalogue whose details need the "
        "listing's context, a POST search form, a login with a CSRF token, a JSON load-more API "
        "and a JavaScript-only page (request log at /__log).",
    )
    t.add_argument(
        "--site",
        choices=("shop", "politeness", "traps", "hostile", "sandbox"),
        default="shop",
        help="traps: an infinite calendar, facets, session ids, /a/a/a…, duplicate "
        "pages and 20 real products (port --port); hostile: pages that change on a schedule "
        "(ETag/Last-Modified, 304), redirect chains and loops, 404/410, a gzip bomb, a 100 MB "
        "page, a trickling page, binary garbage, huge headers, links to forbidden addresses",
    )
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=count, default=8000, help="shop port (default %(default)s)")
    t.add_argument("--listings", type=positive, default=25)
    t.add_argument("--per-page", type=positive, default=20)
    t.add_argument("--latency-ms", type=seconds, default=0.0)

    d = sub.add_parser(
        "demo",
        help="crawl the built-in shop and print what was stored",
        description="Start the test shop on a free loopback port, crawl it with "
        "the shop spider into --db and print the stored records.",
    )
    d.add_argument("--db", default="demo.db")
    d.add_argument("--listings", type=positive, default=5)
    d.add_argument("--per-page", type=positive, default=10)
    d.add_argument(
        "--port",
        type=count,
        default=8765,
        help="loopback port for the shop (default %(default)s, so a rerun resumes the same "
        "crawl; a busy port falls back to a free one)",
    )

    k = sub.add_parser(
        "chaos",
        help="the kill test: SIGKILL crawls mid-way, compare to naive; 'chaos --fleet' "
        "runs a partitioned crawl under member kills and a server crash",
        description="Reproduce the article's experiment: kill a crawl at a random "
        "moment after its first request, several times, then let it finish; for "
        "a naive scraper and for idemcrawl. Exits 1 if idemcrawl misses its "
        "guarantees.",
    )
    k.add_argument("--runs", type=count, default=5)
    k.add_argument("--kills", type=count, default=10)
    k.add_argument("--min", type=seconds, default=0.2, dest="min_s")
    k.add_argument("--max", type=seconds, default=1.0, dest="max_s")
    k.add_argument("--seed", type=int, default=1)
    k.add_argument("--concurrency", type=count, default=4)
    k.add_argument(
        "--vary-concurrency",
        action="store_true",
        help="restart idemcrawl with a random --concurrency each time",
    )
    k.add_argument(
        "--latency-ms",
        type=seconds,
        default=None,
        help="server latency per request (default 25 ms x concurrency)",
    )
    k.add_argument("--listings", type=positive, default=25)
    k.add_argument("--per-page", type=positive, default=20)
    k.add_argument("--skip-naive", action="store_true")
    k.add_argument(
        "--db",
        default="sqlite",
        help="idemcrawl's database: 'sqlite' (a file per run, the default) or a postgresql:// "
        "URL (a fresh schema per run, dropped after scoring)",
    )
    k.add_argument("--json", action="store_true")

    b = sub.add_parser("bench", help="benchmarks that report figures (not tests)")
    bsub = b.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    bf = bsub.add_parser(
        "frontier",
        help="lease and completion throughput of a frontier backend",
        description="Drive a frontier backend directly (no HTTP) with politeness on (1 in "
        "flight per host): URLs added/s, lease grants/s, completions/s (each with 1 record, "
        "10 new links and 1 event), bytes on disk per URL and peak RSS; on PostgreSQL also "
        "the server's CPU per 1,000 grants and completions, and statements and round trips "
        "per page. With several --processes, the grants/s curve against the number of crawl "
        "processes.",
    )
    bf.add_argument(
        "--db", default="sqlite", help="'sqlite' (a temp file), 'memory:' or a postgresql:// URL"
    )
    bf.add_argument(
        "--hosts",
        type=count,
        default=None,
        help="hosts seeded (default 1000; 10000 for a curve)",
    )
    bf.add_argument(
        "--urls-per-host",
        type=count,
        default=None,
        help="URLs seeded per host (default 20; 10 for a curve)",
    )
    bf.add_argument(
        "--completions",
        type=count,
        default=None,
        help="completions measured, shared among the processes (default one per seeded URL; "
        "20000 for a curve)",
    )
    bf.add_argument(
        "--processes",
        type=_process_counts,
        default=(1,),
        metavar="N[,N...]",
        help="client processes leasing and completing at once on the one database (default "
        "1); a list such as 1,2,4,8 runs once per value on a fresh frontier and prints the "
        "curve",
    )
    bf.add_argument(
        "--partitions",
        type=positive,
        default=None,
        help="a partitioned crawl of this many partitions on --servers throw-away PostgreSQL "
        "servers, driven by one member that owns them all: grants/s and server CPU per 1,000 "
        "grants and completions (--db and --processes do not apply)",
    )
    bf.add_argument("--servers", type=positive, default=1, help="with --partitions (default 1)")
    bf.add_argument("--json", action="store_true")
    bsub.add_parser(
        "crawl",
        help="pages/s against a generated site, side by side with Scrapy and a bare crawler "
        "(see: idemcrawl bench crawl --help)",
        add_help=False,
    )
    bd = bsub.add_parser(
        "discovery",
        help="links/s through the discovery path, with and without the Bloom filter",
        description="Push N links (a fraction of them repeats) through normalisation, scope, "
        "trap checks, the template gate and insert-if-absent into SQLite; once with the Bloom "
        "negative cache, once looking every link up in the durable key.",
    )
    bd.add_argument("--urls", type=count, default=1_000_000)
    bd.add_argument("--repeats", type=float, default=0.4)
    bd.add_argument("--json", action="store_true")
    bs = bsub.add_parser(
        "startup",
        help="time to the first request and RSS then, on an empty and on a large frontier",
        description="Build an SQLite frontier of --urls URLs on one loopback host (--done of "
        "them completed with stored bodies, through the frontier contract), start a crawl on "
        "it and note when its first request arrives and the crawl's RSS at that moment; the "
        "same on an empty frontier for reference.",
    )
    bs.add_argument("--urls", type=count, default=1_000_000)
    bs.add_argument("--done", type=non_negative_int, default=100_000)
    bs.add_argument("--json", action="store_true")

    sub.add_parser(
        "sim",
        help="deterministic virtual-clock simulation of the scheduler (see: idemcrawl sim "
        "--help); 'sim --fleet' simulates members owning partitions",
        add_help=False,
    )


def run_own_parser(argv: Sequence[str]) -> int | None:
    """Run ``bench crawl``, ``chaos --fleet`` or ``sim``, which parse their own (many)
    options; else None."""
    if list(argv[:2]) == ["bench", "crawl"]:
        from idemcrawl.lab.bench.crawl import main as bench_crawl_main

        return bench_crawl_main(argv[2:])
    if list(argv[:2]) == ["chaos", "--fleet"]:
        from idemcrawl.lab.fleet_chaos import main as fleet_chaos_main

        try:
            return fleet_chaos_main(argv[2:])
        except (ValueError, RuntimeError) as exc:
            print(f"idemcrawl chaos --fleet: error: {exc}", file=sys.stderr)
            return 2
    if list(argv[:2]) == ["sim", "--fleet"]:
        from idemcrawl.lab.fleet_sim import main as fleet_sim_main

        try:
            return fleet_sim_main(argv[2:])
        except ValueError as exc:
            print(f"idemcrawl sim --fleet: error: {exc}", file=sys.stderr)
            return 2
    if list(argv[:1]) == ["sim"]:
        from idemcrawl.frontier import FrontierError
        from idemcrawl.lab.sim import main as sim_main

        try:
            return sim_main(argv[1:])
        except (ValueError, FrontierError) as exc:
            print(f"idemcrawl sim: error: {exc}", file=sys.stderr)
            return 2
    return None


def cmd_testsite(a: argparse.Namespace) -> int:
    try:
        return _serve_testsite(a)
    except (OSError, RuntimeError) as exc:
        if not _address_in_use(exc):
            raise
        raise UsageError(
            f"port {a.port} on {a.host} is in use (another test site still running?); "
            "pick another with --port N, or --port 0 for any free port"
        ) from None


def _address_in_use(exc: BaseException | None) -> bool:
    """EADDRINUSE, raised directly or as the cause of a server's "failed to start"."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _serve_testsite(a: argparse.Namespace) -> int:
    if a.site == "sandbox":
        from idemcrawl.lab.testsite.sandbox import SandboxServer

        server = SandboxServer(host=a.host, port=a.port)
        server.serve_until_signal(
            lambda: print(f"serving the scraping sandbox at {server.base_url}/", flush=True)
        )
        return 0
    if a.site == "hostile":
        from idemcrawl.lab.testsite.hostile import serve_forever

        serve_forever(a.host, a.port)
        return 0
    if a.site == "traps":
        from aiohttp import web

        from idemcrawl.lab.testsite.server import bind, url_host
        from idemcrawl.lab.testsite.traps import TrapSite

        sock = bind(a.host, a.port)  # bound before the line is printed, with the real port
        port = sock.getsockname()[1]
        print(f"serving trap site at http://{url_host(a.host)}:{port}/", flush=True)
        web.run_app(TrapSite().app(), sock=sock, print=None)
        return 0
    if a.site == "politeness":
        from idemcrawl.lab.testsite.multihost import default_hosts, serve_multihost

        serve_multihost(default_hosts(), a.host)
        return 0
    from idemcrawl.lab.testsite import ShopConfig, serve_forever

    serve_forever(a.host, a.port, ShopConfig(a.listings, a.per_page, a.latency_ms))
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from idemcrawl.lab.demo import run_demo

    result = run_demo(a.db, a.listings, a.per_page, a.port, log=_stderr)
    print(f"{'key':<12} {'price':>9}  url")
    for r in result.records:
        print(f"{r['key']:<12} {r['data']['price']:>9}  {r['url']}")
    print(
        f"stored {len(result.records)} records ({result.correct} equal to the pages, "
        f"{len(result.expected)} products); {result.fetched} fetches this run, "
        f"{result.requests} requests seen by the site"
    )
    return 0 if result.ok else 1


def cmd_chaos(a: argparse.Namespace) -> int:
    from idemcrawl.lab.chaos import ChaosOptions, run_chaos

    if a.min_s > a.max_s:
        raise UsageError("--min must not exceed --max")
    try:
        opts = ChaosOptions(
            runs=max(1, a.runs),
            kills=a.kills,
            min_s=a.min_s,
            max_s=a.max_s,
            seed=a.seed,
            concurrency=max(1, a.concurrency),
            vary_concurrency=a.vary_concurrency,
            latency_ms=a.latency_ms,
            listings=max(1, a.listings),
            per_page=max(1, a.per_page),
            naive=not a.skip_naive,
            db=a.db,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    report = run_chaos(opts, log=_stderr)
    print(json.dumps(report.as_dict(), sort_keys=True) if a.json else report.table())
    return 0 if report.ok else 1


def _process_counts(text: str) -> tuple[int, ...]:
    """``N`` or a comma-separated list of process counts, each at least 1."""
    values = tuple(count(part.strip()) for part in text.split(","))
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: process counts must be at least 1")
    return values


def _bench_fleet(a: argparse.Namespace) -> int:
    from idemcrawl.lab.bench.fleet import run_fleet_bench

    given = {"hosts": a.hosts, "urls_per_host": a.urls_per_host, "completions": a.completions}
    try:
        report = run_fleet_bench(
            int(a.partitions),
            int(a.servers),
            **{k: int(v) for k, v in given.items() if v is not None},
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(report.as_dict()) if a.json else report.text())
    return 0


def _bench_frontier(a: argparse.Namespace) -> int:
    from dataclasses import replace

    if a.partitions is not None:
        return _bench_fleet(a)

    from idemcrawl.lab.bench.frontier import (
        CURVE_SIZE,
        FrontierBenchOptions,
        run_frontier_bench,
        run_frontier_curve,
    )

    curve = len(a.processes) > 1
    # Sizes not given are the benchmark's own defaults, or the curve's when several counts are.
    size: dict[str, Any] = dict(CURVE_SIZE) if curve else {}
    given = {"hosts": a.hosts, "urls_per_host": a.urls_per_host, "completions": a.completions}
    size.update({k: v for k, v in given.items() if v is not None})
    opts = replace(FrontierBenchOptions(db=a.db, processes=a.processes[0]), **size)
    try:
        report: Any = (
            run_frontier_curve(opts, a.processes, log=_stderr)
            if curve
            else run_frontier_bench(opts, log=_stderr)
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(report.as_dict()) if a.json else report.text())
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    if a.bench_command == "frontier":
        return _bench_frontier(a)
    if a.bench_command == "discovery":
        from idemcrawl.lab.bench.discovery import run_discovery_bench

        if not 0 <= a.repeats < 1:
            raise UsageError("--repeats must be in [0, 1)")
        dreport = run_discovery_bench(a.urls, a.repeats)
        print(json.dumps(dreport.as_dict()) if a.json else dreport.text())
        return 0
    if a.bench_command == "startup":
        from idemcrawl.lab.bench.startup import report, run_startup_bench

        if a.done > a.urls:
            raise UsageError("--done must not exceed --urls")
        print(report(run_startup_bench(a.urls, a.done, log=_stderr), a.json))
        return 0
    raise UsageError(f"unknown benchmark {a.bench_command!r}")


#: The lab's commands that the ``idemcrawl`` parser dispatches (``sim`` and ``bench crawl`` run
#: through :func:`run_own_parser` before it).
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "testsite": cmd_testsite,
    "demo": cmd_demo,
    "chaos": cmd_chaos,
    "bench": cmd_bench,
}
