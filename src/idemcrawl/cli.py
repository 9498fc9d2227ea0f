"""The command line: a thin layer that parses arguments, calls the library and prints.

Every user error (bad URL, unknown spider, unreadable database, bad flag value) ends as one line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .config import FILE_KEYS, ConfigError, FlagLists, default_of, layered_config
from .control import ACTIONS, ControlError, apply_control, parse_control
from .events import WebhookError
from .export import ExportError
from .frontier import FrontierError, open_frontier
from .parse import SpiderLoadError
from .status import status_dict, status_lines
from .url import InvalidURL
from .version import __version__
from .warc import WarcError


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative number")
    return value


class _Defaults(dict[str, str]):
    """``{name}`` in a help text -> the built-in default of that crawl setting, as shown.

    Read from :class:`~idemcrawl.config.CrawlConfig`, so a changed default changes the help.
    Whole numbers print without ".0"; ``{name_size}`` prints a byte count in KiB/MiB/GiB.
    """

    def __missing__(self, key: str) -> str:
        if key.endswith("_size"):
            n = int(default_of(key.removesuffix("_size")))
            unit, size = next(u for u in _SIZE_UNITS if n % u[1] == 0)
            return f"{n // size} {unit}"
        value = default_of(key)
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)


_SIZE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("bytes", 1))

#: The crawl settings as flags, in --help order: (flag, value type or argparse action, help,
#: extra add_argument keywords). "{name}" in a help text is that setting's CrawlConfig default.
#: A setting flag is absent from the namespace unless typed, so only typed flags beat the
#: config file; "repeat" flags collect a list that adds to the file's (see config.FlagLists).
# fmt: off
_CRAWL_FLAGS: tuple[tuple[str, Any, str, dict[str, Any]], ...] = (
    ("--db", None, "crawl database: an SQLite file path", {}),
    ("--sitemap", "repeat", "read this sitemap (or sitemap index, gzip allowed); repeatable",
     {"metavar": "URL"}),
    ("--spider", None,
     "FILE.py:Class or module:Class (default: follow all links, store no records)", {}),
    ("--concurrency", _positive_int,
     "requests in flight across all hosts (default {concurrency})", {}),
    ("--host-concurrency", _positive_int,
     "requests in flight per host (default {host_concurrency})", {}),
    ("--delay", _seconds,
     "minimum seconds between request starts on one host (default {delay})", {}),
    ("--latency-factor", _seconds, "delay at least this multiple of the host's response time "
     "(default {latency_factor}; 0 = off)", {}),
    ("--lease-seconds", _seconds,
     "how long a leased URL stays claimed if its owner dies (default {lease_seconds})", {}),
    ("--scope", None, "which discovered links to follow (default: the seeds' hosts)",
     {"choices": ("host", "domain", "any")}),
    ("--allow-private", "append", "permit connections to this private/loopback address or "
     "network", {"metavar": "ADDR_OR_CIDR"}),
    ("--max-pages", _positive_int, "stop after leasing this many pages in this run", {}),
    ("--parse-workers", _positive_int,
     "parser processes (default {parse_workers}; 0 = in-process)", {}),
    ("--commit-batch", _positive_int,
     "most completions per group commit (default {commit_batch})", {}),
    ("--commit-seconds", _seconds, "how long a group commit may wait for more completions, "
     "<= 1 (default {commit_seconds})", {}),
    ("--max-retries", _positive_int,
     "retries for timeouts, connection errors and 5xx/429 (default {max_retries})", {}),
    ("--user-agent", None, "User-Agent; its product token is matched against robots.txt "
     "(default {user_agent})", {}),
    ("--ignore-robots", "store_true",
     "do not fetch or obey robots.txt (a crawl preference, not authorisation)", {}),
    ("--robots-max-age", _seconds,
     "seconds a robots.txt copy is trusted (default {robots_max_age})", {}),
    ("--robots-error-ttl", _seconds,
     "seconds before an unreachable robots.txt is retried (default {robots_error_ttl})", {}),
    ("--robots-max-attempts", _positive_int, "unreachable robots.txt answers before a host is "
     "deferred (default {robots_max_attempts})", {}),
    ("--crawl-delay-cap", _seconds, "largest robots.txt Crawl-delay honoured; hosts asking "
     "more are deferred (default {crawl_delay_cap})", {}),
    ("--retry-deferred", "store_true", "requeue URLs an earlier run deferred (Crawl-delay "
     "above the cap, robots.txt unreachable)", {}),
    ("--max-depth", _positive_int,
     "trap defence: links beyond this are not followed (default {max_depth})", {}),
    ("--max-url-length", _positive_int,
     "trap defence: links beyond this are not followed (default {max_url_length})", {}),
    ("--max-query-params", _positive_int,
     "trap defence: links beyond this are not followed (default {max_query_params})", {}),
    ("--max-repeated-segment", _positive_int,
     "trap defence: links beyond this are not followed (default {max_repeated_segment})", {}),
    ("--host-delay", "repeat", "per-host delay between request starts (HOST: host[:port] or "
     "scheme://host[:port])", {"metavar": "HOST=SECONDS"}),
    ("--host-max", "repeat", "per-host requests in flight", {"metavar": "HOST=N"}),
    ("--host-budget", "repeat", "per-host fetches per UTC day (overrides --daily-budget)",
     {"metavar": "HOST=N"}),
    ("--daily-budget", _positive_int,
     "trap defence: fetches per host per UTC day; hosts over it are deferred", {}),
    ("--max-redirects", _non_negative_int, "redirect hops followed from one URL, each a URL of "
     "its own (default {max_redirects})", {}),
    ("--max-bytes", _positive_int,
     "bytes received per response before it is cut (default {max_bytes_size})", {}),
    ("--max-decompressed-bytes", _positive_int, "decompressed bytes kept per response; bombs "
     "stop here (default {max_decompressed_bytes_size})", {}),
    ("--connect-timeout", _seconds, "seconds connect (default {connect_timeout})", {}),
    ("--read-timeout", _seconds, "seconds between two reads (default {read_timeout})", {}),
    ("--total-timeout", _seconds,
     "seconds for a whole response; slow senders are cut (default {total_timeout})", {}),
    ("--recrawl", "store_true",
     "keep running and revisit URLs when they are due (conditional requests)", {}),
    ("--recrawl-min", _seconds,
     "shortest revisit interval in seconds (default {recrawl_min})", {}),
    ("--recrawl-max", _seconds,
     "longest revisit interval in seconds (default {recrawl_max})", {}),
    ("--tombstone-interval", _seconds,
     "seconds before a 404/410 is checked again (default: --recrawl-max)", {}),
    ("--pin", "repeat", "URLs matching REGEX are revisited every SECONDS; repeatable",
     {"metavar": "REGEX=SECONDS"}),
    ("--warc-dir", None, "directory for WARC files (default: DB path + '.warc')", {}),
    ("--no-warc", "store_false", "do not archive exchanges (reparse then has nothing to read)",
     {"dest": "warc"}),
    ("--warc", "store_true",
     "archive exchanges (the default; overrides an earlier --no-warc or the config)",
     {"dest": "warc"}),
    ("--metrics-port", _non_negative_int,
     "serve Prometheus metrics on 127.0.0.1:PORT while crawling", {}),
)
# fmt: on


def _add_crawl_parser(sub: Any) -> None:
    c = sub.add_parser(
        "crawl",
        help="crawl from seed URLs into a crawl database (resumable)",
        description="Crawl from seed URLs. Rerunning the same command on the same database "
        "resumes; on a finished database it makes no request. Settings come from the built-in "
        "defaults, then --config FILE, then the flags given here.",
    )
    c.add_argument("urls", nargs="*", metavar="URL", help="seed URLs (optional when resuming)")
    c.add_argument("--config", help='TOML file with crawl settings and [hosts."HOST"] overrides')
    defaults = _Defaults()
    for flag, kind, text, extra in _CRAWL_FLAGS:
        kw: dict[str, Any] = {"default": argparse.SUPPRESS, **extra}
        if kind == "repeat":
            kw.update(action="append", default=[])
        elif isinstance(kind, str):
            kw["action"] = kind
        elif kind is not None:
            kw["type"] = kind
        c.add_argument(flag, help=text.format_map(defaults), **kw)
    c.add_argument("--json", action="store_true", help="print the run summary as JSON")
    c.add_argument("--quiet", action="store_true", help="no progress lines")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="idemcrawl",
        description="A restart-safe, polite web crawler. Kill it at any instant; rerun the same "
        "command to resume.",
    )
    p.add_argument("--version", action="version", version=f"idemcrawl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    _add_crawl_parser(sub)

    ctl = sub.add_parser(
        "control",
        help="pause/resume/block hosts, change a delay, add URLs — live, across processes",
        description="Change a running crawl through its database: every crawl process "
        "sharing it obeys at its next lease (within a second or two). Without HOST, pause and "
        "resume act on the whole crawl.",
    )
    ctl.add_argument("--db", required=True)
    ctl.add_argument(
        "action",
        choices=ACTIONS,
    )
    ctl.add_argument(
        "args",
        nargs="*",
        metavar="ARG",
        help="pause/resume [HOST]; block/unblock HOST; set-delay HOST SECONDS; "
        "set-budget HOST N; add URL…",
    )

    e = sub.add_parser(
        "export",
        help="export records, URL states, index events or aggregates",
        description="Stream stored rows out of a crawl database (bounded memory). Aggregates "
        "(counts by status and state, bytes, records per source) are recomputed from the "
        "stored rows, never from running counters (R22).",
    )
    e.add_argument("--db", required=True)
    e.add_argument("--format", choices=("jsonl", "csv", "parquet"), default="jsonl")
    e.add_argument("--what", choices=("records", "urls", "events", "aggregates"), default="records")
    e.add_argument("-o", "--output", default="-", help="output file (default stdout)")

    ev = sub.add_parser(
        "events",
        help="read index events after a cursor, or deliver them to a webhook",
        description="One JSON line per completed URL version that changed (R21), with a "
        "monotonically increasing 'cursor'; --webhook POSTs each with an Idempotency-Key header, "
        "retrying with back-off and remembering what was acknowledged, so a restart resumes.",
    )
    ev.add_argument("--db", required=True)
    ev.add_argument("--after", type=_non_negative_int, default=0, metavar="CURSOR")
    ev.add_argument("--limit", type=_positive_int, default=None)
    ev.add_argument("--follow", action="store_true", help="keep waiting for new events")
    ev.add_argument("--webhook", metavar="URL", help="deliver to this http(s) URL")
    ev.add_argument("--consumer", help="delivery cursor name (default 'webhook')")

    sv = sub.add_parser(
        "serve",
        help="a read-only dashboard of a crawl on 127.0.0.1",
        description="Serve a small self-refreshing page (throughput over time, status classes, "
        "slowest hosts and hosts backing off, recent errors, trap triggers) read from the crawl "
        "database, so it shows every process of the crawl. Loopback only.",
    )
    sv.add_argument("--db", required=True)
    sv.add_argument("--port", type=_non_negative_int, default=8089)
    sv.add_argument("--host", default="127.0.0.1", help="a loopback address")

    rp = sub.add_parser(
        "reparse",
        help="parse archived bodies again (no network), e.g. after fixing a spider",
        description="Read every archived page (or, with --where-failed, those whose parse "
        "failed) from the WARC store, run the spider on it and write records and links. "
        "Makes no request to any site.",
    )
    rp.add_argument("--db", required=True)
    rp.add_argument("--spider", help="FILE.py:Class or module:Class")
    rp.add_argument("--where-failed", action="store_true")
    rp.add_argument("--warc-dir", help="WARC directory (default: DB path + '.warc')")
    rp.add_argument("--scope", choices=("host", "domain", "any"), default="host")
    rp.add_argument("--json", action="store_true")
    rp.add_argument("--quiet", action="store_true")

    s = sub.add_parser("status", help="show the state of a crawl database")
    s.add_argument("--db", required=True)
    s.add_argument("--json", action="store_true")

    t = sub.add_parser(
        "testsite",
        help="serve a built-in test site",
        description="Serve a built-in test site on loopback. 'shop' is the article's shop "
        "(listing pages linking products; request counts at /__stats). 'politeness' serves four "
        "hosts, one port each: a and b with robots rules (a also answers 429/503/500 on some "
        "pages), c with robots Crawl-delay 1, d whose robots.txt answers 500; the request log "
        "(host, path, start, end) of all of them is at /__log.",
    )
    t.add_argument(
        "--site",
        choices=("shop", "politeness", "traps", "hostile"),
        default="shop",
        help="traps: an infinite calendar, facets, session ids, /a/a/a…, duplicate "
        "pages and 20 real products (port --port); hostile: pages that change on a schedule "
        "(ETag/Last-Modified, 304), redirect chains and loops, 404/410, a gzip bomb, a 100 MB "
        "page, a trickling page, binary garbage, huge headers, links to forbidden addresses",
    )
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument(
        "--port", type=_positive_int, default=8000, help="shop port (default %(default)s)"
    )
    t.add_argument("--listings", type=_positive_int, default=25)
    t.add_argument("--per-page", type=_positive_int, default=20)
    t.add_argument("--latency-ms", type=_seconds, default=0.0)

    d = sub.add_parser(
        "demo",
        help="crawl the built-in shop and print what was stored",
        description="Start the test shop on a free loopback port, crawl it with "
        "the shop spider into --db and print the stored records.",
    )
    d.add_argument("--db", default="demo.db")
    d.add_argument("--listings", type=_positive_int, default=5)
    d.add_argument("--per-page", type=_positive_int, default=10)
    d.add_argument(
        "--port",
        type=_positive_int,
        default=8765,
        help="loopback port for the shop (default %(default)s, so a rerun resumes the same "
        "crawl; a busy port falls back to a free one)",
    )

    k = sub.add_parser(
        "chaos",
        help="the kill test: SIGKILL crawls mid-way, compare to naive",
        description="Reproduce the article's experiment: kill a crawl at a random "
        "moment after its first request, several times, then let it finish; for "
        "a naive scraper and for idemcrawl. Exits 1 if idemcrawl misses its "
        "guarantees.",
    )
    k.add_argument("--runs", type=_positive_int, default=5)
    k.add_argument("--kills", type=_positive_int, default=10)
    k.add_argument("--min", type=_seconds, default=0.2, dest="min_s")
    k.add_argument("--max", type=_seconds, default=1.0, dest="max_s")
    k.add_argument("--seed", type=int, default=1)
    k.add_argument("--concurrency", type=_positive_int, default=4)
    k.add_argument(
        "--vary-concurrency",
        action="store_true",
        help="restart idemcrawl with a random --concurrency each time",
    )
    k.add_argument(
        "--latency-ms",
        type=_seconds,
        default=None,
        help="server latency per request (default 25 ms x concurrency)",
    )
    k.add_argument("--listings", type=_positive_int, default=25)
    k.add_argument("--per-page", type=_positive_int, default=20)
    k.add_argument("--skip-naive", action="store_true")
    k.add_argument("--json", action="store_true")
    b = sub.add_parser("bench", help="benchmarks that report figures (not tests)")
    bsub = b.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    bf = bsub.add_parser(
        "frontier",
        help="lease and completion throughput of a frontier backend",
        description="Drive a frontier backend directly (no HTTP) with politeness on (1 in "
        "flight per host): URLs added/s, lease grants/s, completions/s (each with 1 record, "
        "10 new links and 1 event), bytes on disk per URL and peak RSS.",
    )
    bf.add_argument("--db", default="sqlite", help="'sqlite' (a temp file) or a postgresql:// URL")
    bf.add_argument("--hosts", type=_positive_int, default=1000)
    bf.add_argument("--urls-per-host", type=_positive_int, default=20)
    bf.add_argument("--completions", type=_positive_int, default=None)
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
    bd.add_argument("--urls", type=_positive_int, default=1_000_000)
    bd.add_argument("--repeats", type=float, default=0.4)
    bd.add_argument("--json", action="store_true")

    sub.add_parser(
        "sim",
        help="deterministic virtual-clock simulation of the scheduler (see: idemcrawl sim --help)",
        add_help=False,
    )

    g = sub.add_parser("db", help="crawl database administration")
    gsub = g.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    gm = gsub.add_parser(
        "migrate",
        help="create or upgrade the crawl schema",
        description="Create the crawl schema, or apply the migrations it lacks, and print the "
        "schema version. Safe to run while crawls run and from several machines at once.",
    )
    gm.add_argument("--db", required=True, help="SQLite path or postgresql://…[?schema=NAME]")
    return p


def cmd_crawl(a: argparse.Namespace) -> int:
    from .engine import run_crawl
    from .progress import ProgressDisplay

    given = {k: v for k, v in vars(a).items() if k in FILE_KEYS}  # only flags typed (SUPPRESS)
    if a.urls:
        given["seeds"] = list(a.urls)
    lists = FlagLists(
        sitemaps=a.sitemap,
        pins=a.pin,
        host_delays=a.host_delay,
        host_maxes=a.host_max,
        host_budgets=a.host_budget,
    )
    cfg = layered_config(a.config, given, lists)
    # A live table on a terminal, JSON lines on stderr otherwise (or with --json), none --quiet.
    mode = "quiet" if a.quiet else ("json" if a.json else "auto")
    with ProgressDisplay(mode) as display:
        summary = run_crawl(
            cfg, progress=display.message, snapshot=display.update, handle_signals=True
        )
    if a.json:
        print(json.dumps(summary.__dict__, sort_keys=True))
    elif not a.quiet:
        print(
            f"{summary.stopped_by}: fetched {summary.fetched}, committed {summary.committed}, "
            f"records written {summary.records}, failed {summary.failed} in "
            f"{summary.seconds:.1f} s"
        )
    if summary.fatal:
        print(f"idemcrawl crawl: error: {summary.fatal}; rerun to resume", file=sys.stderr)
        return 1
    return 0


def cmd_control(a: argparse.Namespace) -> int:
    """Live control through the frontier, so it reaches every process on every machine."""
    f = _open_existing(a.db)
    try:
        print(apply_control(f, parse_control(a.action, a.args)))
    except ValueError as exc:  # a backend refusing the request: one line, like ours
        raise UsageError(str(exc)) from None
    finally:
        f.close()
    return 0


def _open_existing(db: str) -> Any:
    return open_frontier(db, create=False)


def cmd_export(a: argparse.Namespace) -> int:
    from .export import export

    f = _open_existing(a.db)
    try:
        n = export(f, a.format, a.what, a.output)
    finally:
        f.close()
    if a.output != "-":
        print(f"exported {n} {a.what} rows to {a.output}", file=sys.stderr)
    return 0


def cmd_events(a: argparse.Namespace) -> int:
    """Index events with a cursor (R21), or delivered to a webhook with idempotency keys."""
    from .events import deliver_webhook, write_events

    f = _open_existing(a.db)
    try:
        if a.webhook:
            consumer = a.consumer or "webhook"
            if a.after:
                f.set_cursor(consumer, a.after)
            stats = deliver_webhook(f, a.webhook, consumer, stop_when_idle=not a.follow)
            print(json.dumps(stats.as_dict(), sort_keys=True), file=sys.stderr)
        else:
            write_events(f, sys.stdout, a.after, a.limit, a.follow)
    finally:
        f.close()
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    from .serve import serve

    try:
        serve(a.db, a.port, a.host)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_reparse(a: argparse.Namespace) -> int:
    """Parse archived bodies again with the (fixed) spider; no request leaves the machine."""
    from .progress import task_progress
    from .reparse import reparse

    mode = "quiet" if a.quiet else ("json" if a.json else "auto")
    with task_progress(None, "reparse", mode=mode) as bar:

        def show(s: Any) -> None:
            bar.update(s.pages)

        try:
            summary = reparse(
                a.db,
                spider=a.spider,
                where_failed=a.where_failed,
                warc_dir=a.warc_dir,
                scope=a.scope,
                progress=show,
            )
        except FileNotFoundError as exc:
            raise UsageError(str(exc)) from None
    out = dict(summary.__dict__)
    out["requests"] = 0
    if a.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(
            f"reparsed {summary.pages} pages: {summary.records} records written, "
            f"{summary.failed} parse failures, {summary.missing} unreadable, 0 requests"
        )
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    d = status_dict(a.db)
    if a.json:
        print(json.dumps(d, sort_keys=True, default=str))
    else:
        print("\n".join(status_lines(d)))
    return 0


def cmd_testsite(a: argparse.Namespace) -> int:
    if a.site == "hostile":
        from .lab.testsite.hostile import serve_forever

        serve_forever(a.host, a.port)
        return 0
    if a.site == "traps":
        from aiohttp import web

        from .lab.testsite.traps import TrapSite

        print(f"serving trap site at http://{a.host}:{a.port}/", flush=True)
        web.run_app(TrapSite().app(), host=a.host, port=a.port, print=None)
        return 0
    if a.site == "politeness":
        from .lab.testsite.multihost import default_hosts, serve_multihost

        serve_multihost(default_hosts(), a.host)
        return 0
    from .lab.testsite import ShopConfig, serve_forever

    serve_forever(a.host, a.port, ShopConfig(a.listings, a.per_page, a.latency_ms))
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    from .lab.demo import run_demo

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    result = run_demo(a.db, a.listings, a.per_page, a.port, log=say)
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
    from .lab.chaos import ChaosOptions, run_chaos

    if a.min_s > a.max_s:
        raise UsageError("--min must not exceed --max")
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
    )
    report = run_chaos(opts, log=lambda line: print(line, file=sys.stderr))
    if a.json:
        print(json.dumps(report.as_dict(), sort_keys=True))
    else:
        print(report.table())
    return 0 if report.ok else 1


def cmd_bench(a: argparse.Namespace) -> int:
    if a.bench_command == "frontier":
        from .lab.bench.frontier import FrontierBenchOptions, run_frontier_bench

        opts = FrontierBenchOptions(
            db=a.db, hosts=a.hosts, urls_per_host=a.urls_per_host, completions=a.completions
        )
        try:
            report = run_frontier_bench(opts, log=lambda line: print(line, file=sys.stderr))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(json.dumps(report.as_dict()) if a.json else report.text())
        return 0
    if a.bench_command == "discovery":
        from .lab.bench.discovery import run_discovery_bench

        if not 0 <= a.repeats < 1:
            raise UsageError("--repeats must be in [0, 1)")
        dreport = run_discovery_bench(a.urls, a.repeats)
        print(json.dumps(dreport.as_dict()) if a.json else dreport.text())
        return 0
    raise UsageError(f"unknown benchmark {a.bench_command!r}")


def cmd_db(a: argparse.Namespace) -> int:
    f = open_frontier(a.db)
    try:
        version = f.migrate() if hasattr(f, "migrate") else None
        if version is None:
            from .frontier.sqlite import SCHEMA_VERSION

            version = SCHEMA_VERSION
    finally:
        f.close()
    print(f"{a.db}: schema version {version}")
    return 0


COMMANDS = {
    "bench": cmd_bench,
    "db": cmd_db,
    "crawl": cmd_crawl,
    "export": cmd_export,
    "status": cmd_status,
    "testsite": cmd_testsite,
    "demo": cmd_demo,
    "chaos": cmd_chaos,
    "control": cmd_control,
    "events": cmd_events,
    "reparse": cmd_reparse,
    "serve": cmd_serve,
}


def cmd_sim(argv: Sequence[str]) -> int:
    from .lab.sim import main as sim_main

    return sim_main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "crawl"]:  # the crawl benchmark owns its options too
        from .lab.bench.crawl import main as bench_crawl_main

        return bench_crawl_main(argv[2:])
    if argv[:1] == ["sim"]:  # the simulator owns its (many) options
        try:
            return cmd_sim(argv[1:])
        except ValueError as exc:
            print(f"idemcrawl sim: error: {exc}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (
        UsageError,
        InvalidURL,
        SpiderLoadError,
        FrontierError,
        ExportError,
        WebhookError,
        ConfigError,
        ControlError,
        WarcError,
    ) as exc:
        print(f"idemcrawl {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"idemcrawl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        print(f"idemcrawl {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
