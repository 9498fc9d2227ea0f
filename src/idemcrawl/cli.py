"""The command line: a thin layer that parses arguments, calls the library and prints.

Every user error (bad URL, unknown spider, unreadable database, bad flag value) ends as one line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .argtypes import UsageError, count, non_negative_int, seconds
from .config import FILE_KEYS, ConfigError, FlagLists, default_of, layered_config
from .control import ACTIONS, ControlError, apply_control, parse_control
from .events import WebhookError
from .export import ExportError
from .failures import CRAWL_EXIT_STATUSES, failure_lines
from .frontier import FrontierError, open_frontier
from .lab import commands as lab_commands
from .parse import SpiderLoadError, load_spider
from .preflight import refused_seeds
from .render import RenderError
from .status import status_dict, status_lines
from .url import InvalidURL
from .version import __version__
from .waiting import work_left_lines
from .warc import WarcError


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

#: The crawl settings as flags, in --help order: (flag, value type or argparse action, help[,
#: more add_argument keywords]). "{name}" in a help text is that setting's CrawlConfig default.
#: A setting flag is absent from the namespace unless typed, so only typed flags beat the
#: config file; "repeat" flags collect a list that adds to the file's (see config.FlagLists).
# fmt: off
_CRAWL_FLAGS: tuple[tuple[Any, ...], ...] = (
    ("--db", None, "crawl database: an SQLite file path or postgresql://… (required, here or "
     "in --config)"),
    ("--db-wait", seconds, "seconds to keep trying a database server that refuses connections "
     "or is starting up before giving up (default {db_wait}; 0 = fail at once)"),
    ("--sitemap", "repeat", "read this sitemap (or sitemap index, gzip allowed); repeatable",
     {"metavar": "URL"}),
    ("--spider", None,
     "FILE.py:Class or module:Class (default: follow all links, store no records)"),
    ("--concurrency", count,
     "requests in flight across all hosts (default {concurrency})"),
    ("--host-concurrency", count,
     "requests in flight per host (default {host_concurrency})"),
    ("--delay", seconds,
     "minimum seconds between request starts on one host (default {delay})"),
    ("--latency-factor", seconds, "delay at least this multiple of the host's response time "
     "above --fast-latency, divided by its allowed concurrency (default {latency_factor}; "
     "0 = off)"),
    ("--fast-latency", seconds, "response times up to this add no adaptive delay "
     "(default {fast_latency})"),
    ("--lease-seconds", seconds,
     "how long a leased URL stays claimed if its owner dies (default {lease_seconds})"),
    ("--lease-ahead", non_negative_int, "leases kept ready beyond the idle workers, only from "
     "hosts with no delay between starts (default: --concurrency; 0 = off)"),
    ("--scope", None, "which discovered links to follow: the seeds' hosts, their sites, or "
     "any (default: host; any for a spider with allowed_domains, which then decide)",
     {"choices": ("host", "domain", "any")}),
    ("--allow-private", "append", "permit connections to this private/loopback address or "
     "network; repeatable (default: every private address is refused)",
     {"metavar": "ADDR_OR_CIDR"}),
    ("--max-pages", count, "stop after leasing this many pages in this run (default: no "
     "limit)"),
    ("--requisites", "store_true", "also fetch what each page needs to render (stylesheets, "
     "scripts, images, on any host, each under its own robots.txt and politeness) and archive "
     "it, for crawls meant for replay (default: off)"),
    ("--render", "store_true", "run each HTML page in headless Chromium before parsing, for "
     "pages built by JavaScript (needs the 'render' extra and a Chromium; default: off, or "
     "the spider's render)"),
    ("--render-timeout", seconds, "cut a page's render after this many seconds "
     "(default {render_timeout})"),
    ("--render-contexts", count, "pages rendered at once (default {render_contexts})"),
    ("--horizon", seconds, "without --recrawl, stop with exit status 3 once nothing left can "
     "start within this many seconds (default {horizon}; 0 = wait however long)"),
    ("--parse-workers", count,
     "parser processes (default: CPU cores - 1, here {parse_workers}; 0 = in-process)"),
    ("--commit-batch", count,
     "most completions per group commit (default {commit_batch})"),
    ("--commit-seconds", seconds, "how long a group commit may wait for more completions, "
     "<= 1 (default {commit_seconds})"),
    ("--max-retries", count,
     "retries for timeouts, connection errors and 5xx/429 (default {max_retries})"),
    ("--user-agent", None, "User-Agent; its product token is matched against robots.txt "
     "(default {user_agent})"),
    ("--ignore-robots", "store_true",
     "do not fetch or obey robots.txt (a crawl preference, not authorisation; default: "
     "off)"),
    ("--robots-max-age", seconds,
     "seconds a robots.txt copy is trusted (default {robots_max_age})"),
    ("--robots-error-ttl", seconds,
     "seconds before an unreachable robots.txt is retried (default {robots_error_ttl})"),
    ("--robots-max-attempts", count, "unreachable robots.txt answers before a host is "
     "deferred (default {robots_max_attempts})"),
    ("--crawl-delay-cap", seconds, "largest robots.txt Crawl-delay honoured; hosts asking "
     "more are deferred (default {crawl_delay_cap})"),
    ("--retry-deferred", "store_true", "requeue URLs an earlier run deferred (Crawl-delay "
     "above the cap, robots.txt unreachable; default: off, so a restart changes nothing)"),
    ("--max-depth", count,
     "trap defence: links beyond this are not followed (default {max_depth})"),
    ("--max-url-length", count,
     "trap defence: links beyond this are not followed (default {max_url_length})"),
    ("--max-query-params", count,
     "trap defence: links beyond this are not followed (default {max_query_params})"),
    ("--max-repeated-segment", count,
     "trap defence: links beyond this are not followed (default {max_repeated_segment})"),
    ("--host-delay", "repeat", "per-host delay between request starts (HOST: host[:port] or "
     "scheme://host[:port]); repeatable (default: --delay)", {"metavar": "HOST=SECONDS"}),
    ("--host-max", "repeat", "per-host requests in flight; repeatable (default: "
     "--host-concurrency)", {"metavar": "HOST=N"}),
    ("--host-budget", "repeat", "per-host fetches per UTC day; repeatable (default: "
     "--daily-budget)", {"metavar": "HOST=N"}),
    ("--daily-budget", count,
     "trap defence: fetches per host per UTC day; hosts over it are deferred (default: "
     "unlimited)"),
    ("--max-redirects", non_negative_int, "redirect hops followed from one URL, each a URL of "
     "its own (default {max_redirects})"),
    ("--max-bytes", count,
     "bytes received per response before it is cut (default {max_bytes_size})"),
    ("--max-decompressed-bytes", count, "decompressed bytes kept per response; bombs "
     "stop here (default {max_decompressed_bytes_size})"),
    ("--connect-timeout", seconds, "seconds connect (default {connect_timeout})"),
    ("--read-timeout", seconds, "seconds between two reads (default {read_timeout})"),
    ("--total-timeout", seconds,
     "seconds for a whole response; slow senders are cut (default {total_timeout})"),
    ("--recrawl", "store_true",
     "keep running and revisit URLs when they are due (conditional requests; default: off, "
     "the crawl ends when nothing is left)"),
    ("--recrawl-min", seconds,
     "shortest revisit interval in seconds (default {recrawl_min})"),
    ("--recrawl-max", seconds,
     "longest revisit interval in seconds (default {recrawl_max})"),
    ("--tombstone-interval", seconds,
     "seconds before a 404/410 is checked again (default: --recrawl-max)"),
    ("--pin", "repeat", "URLs matching REGEX are revisited every SECONDS; repeatable",
     {"metavar": "REGEX=SECONDS"}),
    ("--warc-dir", None, "directory for WARC files (default: DB path + '.warc')"),
    ("--no-warc", "store_false", "do not archive exchanges (reparse then has nothing to read; "
     "default: archive)", {"dest": "warc"}),
    ("--warc", "store_true",
     "archive exchanges (the default; overrides an earlier --no-warc or the config)",
     {"dest": "warc"}),
    ("--warc-level", non_negative_int,
     "compression level of the WARC records: 0-3 ISA-L (fast), 4-9 zlib (smaller); default "
     "{warc_level} (docs/warc.md has the trade)"),
    ("--metrics-port", non_negative_int,
     "serve Prometheus metrics on 127.0.0.1:PORT while crawling (default: off)"),
)
# fmt: on

#: ``crawl --help``'s sections: (title, the flags in it, in order). A flag in none of them is
#: listed under "other options" (a test keeps that list empty).
_CRAWL_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("what to crawl", (
        "URL", "--config", "--db", "--db-wait", "--sitemap", "--scope", "--allow-private",
        "--max-pages", "--horizon", "--requisites",
    )),
    ("spider", ("--spider", "--render", "--render-timeout", "--render-contexts")),
    ("politeness (per host, shared by every process of the crawl)", (
        "--delay", "--host-concurrency", "--latency-factor", "--fast-latency", "--host-delay",
        "--host-max", "--user-agent", "--ignore-robots", "--robots-max-age",
        "--robots-error-ttl", "--robots-max-attempts", "--crawl-delay-cap", "--retry-deferred",
    )),
    ("limits and trap defences", (
        "--max-depth", "--max-url-length", "--max-query-params", "--max-repeated-segment",
        "--daily-budget", "--host-budget", "--max-redirects", "--max-retries", "--max-bytes",
        "--max-decompressed-bytes", "--connect-timeout", "--read-timeout", "--total-timeout",
    )),
    ("recrawl", ("--recrawl", "--recrawl-min", "--recrawl-max", "--tombstone-interval", "--pin")),
    ("storage and output", (
        "--warc", "--no-warc", "--warc-dir", "--warc-level", "--json", "--quiet",
        "--metrics-port",
    )),
    ("performance", ("--concurrency", "--parse-workers", "--commit-batch", "--commit-seconds")),
    ("fleet (several crawl processes on one database)", ("--lease-seconds", "--lease-ahead")),
)  # fmt: skip


def _add_crawl_parser(sub: Any) -> None:
    c = sub.add_parser(
        "crawl",
        help="crawl from seed URLs into a crawl database (resumable)",
        description="Crawl from seed URLs. Rerunning the same command on the same database "
        "resumes; on a finished database it makes no request. Settings come from the built-in "
        "defaults, then the spider's custom_settings, then --config FILE, then the flags given "
        "here.",
        epilog=CRAWL_EXIT_STATUSES,
    )
    groups = {title: c.add_argument_group(title) for title, _ in _CRAWL_GROUPS}
    group_of = {flag: groups[title] for title, flags in _CRAWL_GROUPS for flag in flags}
    other = c.add_argument_group("other options")
    group_of["URL"].add_argument(
        "urls", nargs="*", metavar="URL", help="seed URLs (optional when resuming)"
    )
    group_of["--config"].add_argument(
        "--config", help='TOML file with crawl settings and [hosts."HOST"] overrides (default: '
        "none: the built-in defaults and the spider's custom_settings)",
    )  # fmt: skip
    defaults = _Defaults()
    flags = {f[0]: f for f in _CRAWL_FLAGS}
    order = [f for _, fs in _CRAWL_GROUPS for f in fs if f in flags]
    for flag, kind, text, *extra in [flags[f] for f in order] + [
        f for f in _CRAWL_FLAGS if f[0] not in group_of
    ]:
        kw: dict[str, Any] = {"default": argparse.SUPPRESS, **(extra[0] if extra else {})}
        if kind == "repeat":
            kw.update(action="append", default=[])
        elif isinstance(kind, str):
            kw["action"] = kind
        elif kind is not None:
            kw["type"] = kind
        group_of.get(flag, other).add_argument(flag, help=text.format_map(defaults), **kw)
    group_of["--json"].add_argument(
        "--json", action="store_true", help="print the run summary as JSON (default: a line)"
    )
    group_of["--quiet"].add_argument(
        "--quiet", action="store_true", help="no progress lines (default: progress on stderr)"
    )


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
    ctl.add_argument("action", choices=ACTIONS)
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
    ev.add_argument("--after", type=non_negative_int, default=0, metavar="CURSOR")
    ev.add_argument("--limit", type=count, default=None)
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
    sv.add_argument("--port", type=non_negative_int, default=8089)
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

    pp = sub.add_parser(
        "parse",
        help="fetch one URL and print what a spider callback yields (stores nothing)",
        description="Fetch URL once (SSRF guard and limits as in a crawl, no redirect "
        "followed), run the spider's callback on it as a parser process would and print the "
        "records and requests it yields (URL, method, callback, context) — nothing is stored.",
    )
    pp.add_argument("url", metavar="URL")
    pp.add_argument("--spider", help="FILE.py:Class or module:Class (default: follow links)")
    pp.add_argument("--callback", help="the spider method to call (default parse)")
    pp.add_argument("--data", help="the callback's context, a JSON object (page.data)")
    pp.add_argument(
        "--cb-kwargs",
        help="keyword arguments for the callback, a JSON object (Scrapy's --cbkwargs)",
    )
    pp.add_argument("--scope", choices=("host", "domain", "any"), default="host")
    pp.add_argument("--allow-private", action="append", default=[], metavar="ADDR_OR_CIDR")
    pp.add_argument("--json", action="store_true", help="one JSON object")

    sh = sub.add_parser(
        "shell",
        help="a Python prompt with a fetched page loaded",
        description="Fetch URL once and open a Python prompt with `page` (css, xpath, json, "
        "follow…), `response`, `spider` (an instance of --spider), `Request` and `from_form`.",
    )
    sh.add_argument("url", metavar="URL")
    sh.add_argument("--spider", help="FILE.py:Class or module:Class")
    sh.add_argument("--allow-private", action="append", default=[], metavar="ADDR_OR_CIDR")

    nw = sub.add_parser(
        "new",
        help="write a starter spider NAME.py",
        description="Write NAME.py in --dir with a starter spider: start_urls, a listing "
        "callback following items with context, a detail callback yielding records.",
    )
    nw.add_argument("name", metavar="NAME")
    nw.add_argument("--dir", default=".", help="where to write it (default: here)")

    s = sub.add_parser("status", help="show the state of a crawl database")
    s.add_argument("--db", required=True)
    s.add_argument("--json", action="store_true")

    lab_commands.add_parsers(sub)

    g = sub.add_parser("db", help="crawl database administration")
    gsub = g.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    gm = gsub.add_parser(
        "migrate",
        help="create or upgrade the crawl schema",
        description="Create the crawl schema, or apply the migrations it lacks, and print the "
        "schema version. Safe to run while crawls run and from several machines at once.",
    )
    gm.add_argument("--db", required=True, help="SQLite path or postgresql://…[?schema=NAME]")
    gi = gsub.add_parser(
        "init",
        help="create a crawl partitioned over several PostgreSQL servers",
        description="Create a crawl of P partitions spread over the given PostgreSQL servers "
        "(partition p on server p mod S, schema NAME_pNNN) and store the partition map on "
        "every server, so that crawl, status, export… given any one of these URLs find the "
        "whole crawl. Running it again with the same map changes nothing.",
    )
    gi.add_argument("--partitions", type=int, required=True, help="P, fixed for the crawl")
    gi.add_argument(
        "--db",
        action="append",
        required=True,
        help="postgresql://…[?schema=NAME] of one server (repeat for each server)",
    )
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
    cfg = layered_config(a.config, given, lists, load_spider)
    starts = _start_urls(cfg)
    refused = refused_seeds((*cfg.seeds, *cfg.sitemaps, *starts), cfg.allow_private)
    if refused:  # a setting, not a failure to remember: nothing is written (R18, #18)
        raise UsageError("; ".join(r.message() for r in refused))
    # A live table on a terminal, JSON lines on stderr otherwise (or with --json), none --quiet.
    mode = "quiet" if a.quiet else ("json" if a.json else "auto")
    with ProgressDisplay(mode) as display:
        summary = run_crawl(
            cfg,
            progress=display.message,
            snapshot=display.update,
            handle_signals=True,
            freeze_startup=True,
        )
    if a.json:
        print(json.dumps({**summary.__dict__, "complete": summary.complete}, sort_keys=True))
    elif not a.quiet:
        print(
            f"{summary.stopped_by}: fetched {summary.fetched}, committed {summary.committed}, "
            f"records written {summary.records}, failed {summary.failed} in "
            f"{summary.seconds:.1f} s"
        )
        for line in work_left_lines(summary) + summary.scope_lines(cfg.scope):
            print(line)
        for line in failure_lines(summary.failed_urls, summary.failures):
            print(line)
    if summary.fatal:
        print(f"idemcrawl crawl: error: {summary.fatal}; rerun to resume", file=sys.stderr)
    return summary.exit_status()


def _start_urls(cfg: Any) -> list[str]:
    """The URLs of the spider's start requests (checked like seeds), or a usage error when a
    new crawl has neither seeds nor start requests."""
    if not cfg.spider:
        return []
    from .frontier.base import request_url
    from .parse import load_spider, start_links

    spider = load_spider(cfg.spider)  # SpiderLoadError: a usage error, reported by main()
    try:
        links = start_links(spider())
    except Exception as exc:  # the spider's own start_requests code
        raise UsageError(f"spider start_requests: {type(exc).__name__}: {exc}") from None
    if not links and not cfg.seeds and not cfg.sitemaps and not os.path.exists(cfg.db):
        raise UsageError(
            f"no seed URLs given, spider {cfg.spider} has no start_urls or start_requests, "
            f"and no crawl database at {cfg.db!r} to resume"
        )
    return [request_url(u.url) for u in links]


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


def cmd_db(a: argparse.Namespace) -> int:
    if a.db_command == "init":
        from .fleet.frontier import init_crawl

        pmap = init_crawl(a.db, a.partitions)
        print(
            f"crawl {pmap.crawl}: {pmap.partitions} partitions over {len(pmap.servers)} "
            "servers; give crawl any one of them as --db"
        )
        return 0
    f = open_frontier(a.db)
    try:
        # SQLite migrates on open and has no migrate() yet; the frontier rework gives every
        # backend one, and then this is just ``version = f.migrate()``.
        version = f.migrate() if hasattr(f, "migrate") else None
        if version is None:
            from .frontier.sqlite import SCHEMA_VERSION

            version = SCHEMA_VERSION
    finally:
        f.close()
    print(f"{a.db}: schema version {version}")
    return 0


def _fetch_for_dev(a: argparse.Namespace) -> Any:
    from .devloop import DevLoopError, fetch_one
    from .fetch import FetchSettings, parse_allow_list

    try:
        settings = FetchSettings(allow_private=parse_allow_list(a.allow_private))
        return fetch_one(a.url, settings)
    except (ValueError, DevLoopError) as exc:
        raise UsageError(str(exc)) from None


def _json_object(text: str | None, flag: str) -> dict[str, Any] | None:
    """A flag's JSON object, or UsageError naming the flag."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object")
    return value


def cmd_parse(a: argparse.Namespace) -> int:
    from .devloop import DevLoopError, format_parsed, parse_once
    from .parse import load_spider

    spider = load_spider(a.spider)  # a bad spider or callback before any request
    if a.callback and (
        a.callback.startswith("_") or not callable(getattr(spider, a.callback, None))
    ):
        raise UsageError(f"unknown callback {a.callback!r}: {spider.__name__} has no such method")
    data, cb_kwargs = _json_object(a.data, "--data"), _json_object(a.cb_kwargs, "--cb-kwargs")
    res = _fetch_for_dev(a)
    try:
        out = parse_once(
            a.spider, res, callback=a.callback, data=data, scope=a.scope, cb_kwargs=cb_kwargs
        )
    except (ValueError, TypeError, DevLoopError) as exc:  # TypeError: cb_kwargs it cannot take
        raise UsageError(str(exc)) from None
    print(json.dumps(out.as_json(), ensure_ascii=False) if a.json else format_parsed(out))
    return 1 if out.error else 0


def cmd_shell(a: argparse.Namespace) -> int:
    import code

    from .devloop import SHELL_BANNER, shell_namespace
    from .parse import load_spider

    load_spider(a.spider)
    res = _fetch_for_dev(a)
    namespace = shell_namespace(res, a.spider)
    page = namespace["page"]
    banner = SHELL_BANNER.format(
        status=res.status, url=res.url, ctype=page.content_type or "?", size=len(res.body)
    )
    code.interact(banner=banner, local=namespace, exitmsg="")
    return 0


def cmd_new(a: argparse.Namespace) -> int:
    from pathlib import Path

    from .devloop import DevLoopError, new_spider, spider_class_name

    try:
        path = new_spider(a.name, Path(a.dir))
    except DevLoopError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {path}; try: idemcrawl parse URL --spider {path}:{spider_class_name(a.name)}")
    return 0


COMMANDS = {
    "crawl": cmd_crawl,
    "parse": cmd_parse,
    "shell": cmd_shell,
    "new": cmd_new,
    "control": cmd_control,
    "export": cmd_export,
    "events": cmd_events,
    "serve": cmd_serve,
    "reparse": cmd_reparse,
    "status": cmd_status,
    "db": cmd_db,
    **lab_commands.COMMANDS,
}


def _check_databases(args: argparse.Namespace) -> None:
    """Every command's --db goes through here first: a server URL without the PostgreSQL
    driver (a raw ImportError otherwise, from `db init` too) ends as one line through
    main()'s handler (a FrontierError). A crawl that cannot be opened is each command's own
    FrontierError, reported the same way."""
    given = getattr(args, "db", None)
    for db in [given] if isinstance(given, str) else given or []:
        if db.startswith(("postgresql://", "postgres://")):
            from .frontier.postgres import require_driver

            require_driver()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = lab_commands.run_own_parser(argv)  # sim and bench crawl own their (many) options
    if own is not None:
        return own
    args = build_parser().parse_args(argv)
    try:
        _check_databases(args)
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
        RenderError,
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
