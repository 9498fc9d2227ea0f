"""Every crawl setting in one place, with its default and why (cf. Scrapy's default_settings).

Also how a crawl's settings are put together from their four layers (built-in defaults, the
spider's ``custom_settings``, an optional TOML file, the flags given on the command line):
:func:`layered_config`. The command line only collects what was typed; the rules about what
wins and what is valid live here, so a program embedding the crawler gets the same answers and
the same one-line errors.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import url as urls
from .fetch import IPNetwork, parse_allow_list
from .frontier.base import HostPolicy
from .recrawl import PinError, RecrawlPolicy, parse_pin
from .robots import RobotsCache, RobotsSettings
from .traps import TrapLimits
from .version import DEFAULT_USER_AGENT


def default_parse_workers() -> int:
    """One parser process per spare core: the main process keeps one core for I/O and SQL."""
    return max(1, (os.cpu_count() or 2) - 1)


@dataclass(frozen=True)
class CrawlConfig:
    db: str
    seeds: tuple[str, ...] = ()
    #: Sitemap URLs to read (R12); their hosts join the scope like seeds'.
    sitemaps: tuple[str, ...] = ()
    spider: str | None = None
    #: Requests in flight across all hosts (one asyncio task each).
    concurrency: int = 16
    #: Politeness defaults (R6): one request in flight per host, one second between starts.
    host_concurrency: int = 1
    delay: float = 1.0
    #: A lease must outlive a whole fetch + parse; expiry is only for crashed owners.
    lease_seconds: float = 120.0
    #: Seconds a starting crawl keeps trying a database server that refuses connections or is
    #: starting up (a restart, a crash's recovery) before it gives up: a fleet member started
    #: during its server's outage starts when the server is back (``open_frontier``).
    db_wait: float = 60.0
    #: Leases kept in hand beyond the workers waiting for one (``engine/feeder.py``), only
    #: from hosts that space no starts; None: ``concurrency`` (``leases_ahead``); 0: lease only for
    #: waiting workers.
    lease_ahead: int | None = None
    #: host: same host_key as a seed; domain: same registrable-ish domain; any: everything.
    scope: str = "host"
    allow_private: tuple[IPNetwork, ...] = ()
    #: Stop leasing after this many fetches in this run (None: crawl to the end).
    max_pages: int | None = None
    #: Without --recrawl, stop (exit status 3, work left, named per host) once nothing is in
    #: flight and nothing left can start within this many seconds: a host resting an hour after
    #: its robots.txt failed should not keep a finite crawl waiting. 0 waits however long.
    horizon: float = 60.0
    #: Also fetch what each page needs to render (stylesheets, scripts, images; on any host,
    #: under each host's own robots.txt and politeness), archived for replay (like wget -p).
    requisites: bool = False
    #: Run every HTML page in headless Chromium before parsing (JavaScript pages; render.py),
    #: at most ``render_contexts`` at once, each cut after ``render_timeout`` seconds.
    render: bool = False
    render_timeout: float = 30.0
    render_contexts: int = 2
    #: Adaptive politeness: at least this multiple of a host's recent response time between
    #: request starts (Mercator/Heritrix); 0 turns it off.
    latency_factor: float = 2.0
    #: Response times up to this add no adaptive delay; only the slowness above it is
    #: multiplied (a host answering that fast is not straining: politeness.py).
    fast_latency: float = 0.1
    #: Host back-off after errors (full jitter over base * 2**streak, capped) and the circuit
    #: breaker that rests a host after that many consecutive errors.
    backoff_base: float = 1.0
    backoff_cap: float = 600.0
    retry_after_cap: float = 3600.0
    breaker_threshold: int = 8
    breaker_seconds: float = 300.0
    #: robots.txt (R7): obeyed unless ignore_robots; cached max_age, retried after error_ttl
    #: when unreachable, up to robots_max_attempts times before the host is deferred.
    ignore_robots: bool = False
    robots_max_age: float = 86400.0
    robots_error_ttl: float = 3600.0
    robots_max_attempts: int = 3
    crawl_delay_cap: float = 30.0
    #: Requeue URLs deferred by an earlier run (after raising the cap, fixing robots.txt…).
    #: Off by default so that a restart after a kill changes nothing.
    retry_deferred: bool = False
    #: Per-host overrides: host_key (or bare host) -> {"delay": s, "concurrency": n}.
    host_overrides: tuple[tuple[str, float | None, int | None], ...] = ()
    #: Trap defences (R17): links beyond these limits are not followed, and counted by reason.
    max_depth: int = 100
    max_url_length: int = 2048
    max_query_params: int = 12
    max_repeated_segment: int = 3
    #: A URL template (digits → N, …) that mints more new URLs than this is paused and sampled.
    template_growth_limit: int = 1000
    template_sample_every: int = 50
    #: Parser processes; 0 parses in the main process (tests, tiny crawls).
    parse_workers: int = field(default_factory=default_parse_workers)
    #: Group commit bounds (R5): at most this many completions per transaction …
    commit_batch: int = 64
    #: … and a batch lingers at most this long for more completions before it commits. The
    #: default 0 commits as soon as the previous commit ends (batches form while it runs), which
    #: keeps the work a kill can lose to what is in flight.
    commit_seconds: float = 0.0
    #: Transient errors (timeouts, 5xx, 429) are retried this many times before failing the URL.
    max_retries: int = 3
    retry_base: float = 2.0
    retry_cap: float = 600.0
    #: Sent with every request; its product token is what robots.txt groups are matched on.
    user_agent: str = DEFAULT_USER_AGENT
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    total_timeout: float = 60.0
    max_bytes: int = 10 * 1024 * 1024
    #: How long a parse may take before the URL is failed and the parser process replaced.
    parse_timeout: float = 60.0
    #: Address-space cap of each parser process (bytes); 0 = no cap.
    parse_memory_limit: int = 2 * 1024**3
    #: Decompressed bytes kept of one response (gzip/deflate/br/zstd bombs stop here, R17).
    max_decompressed_bytes: int = 10 * 1024 * 1024
    #: Redirect hops followed from one URL (R14); each hop is a URL of its own.
    max_redirects: int = 5
    #: Per-host fetch budget per UTC day (R17); None = unlimited. Hosts over it are deferred.
    daily_budget: int | None = None
    #: Per-host budgets that override ``daily_budget``: (host_key, fetches per day).
    host_budgets: tuple[tuple[str, int], ...] = ()
    #: Keep running and revisit URLs when their ``next_fetch_at`` comes (R16). Without it a
    #: crawl ends when nothing is queued.
    recrawl: bool = False
    #: Revisit interval bounds (R16): changed pages halve it, unchanged double it.
    recrawl_min: float = 86_400.0
    recrawl_max: float = 30 * 86_400.0
    #: 404/410 tombstones are checked again after this long (None: recrawl_max) (R15).
    tombstone_interval: float | None = None
    #: (regex, seconds): URLs matching a pin keep that fixed revisit interval.
    pins: tuple[tuple[str, float], ...] = ()
    #: Near-duplicate threshold (R11): SimHash Hamming distance at most this (0-3).
    near_dup_distance: int = 3
    #: Archive every exchange as WARC (R20) into ``warc_dir`` (default: next to the database).
    warc: bool = True
    warc_dir: str | None = None
    warc_max_file_bytes: int = 1 << 30
    #: Level of every WARC record: 0-3 ISA-L, 4-9 zlib; ``warc.COMPRESSION_LEVEL`` says why 1.
    warc_level: int = 1
    #: Serve Prometheus metrics on 127.0.0.1:PORT while crawling (R24); None = off.
    metrics_port: int | None = None

    def validate(self) -> None:
        problems = []
        if self.concurrency < 1:
            problems.append("--concurrency must be >= 1")
        if self.host_concurrency < 1:
            problems.append("--host-concurrency must be >= 1")
        if self.delay < 0:
            problems.append("--delay must be >= 0")
        if self.lease_seconds <= 0:
            problems.append("--lease-seconds must be > 0")
        if not self.db_wait >= 0:
            problems.append("--db-wait must be >= 0")
        if self.lease_ahead is not None and not 0 <= self.lease_ahead <= 100_000:
            problems.append("--lease-ahead must be between 0 and 100000")
        if self.scope not in ("host", "domain", "any"):
            problems.append("--scope must be host, domain or any")
        if self.max_pages is not None and self.max_pages < 1:
            problems.append("--max-pages must be >= 1")
        if not self.horizon >= 0:
            problems.append("--horizon must be >= 0")
        if self.parse_workers < 0:
            problems.append("--parse-workers must be >= 0")
        if not 1 <= self.commit_batch <= 10_000:
            problems.append("--commit-batch must be between 1 and 10000")
        if not 0 <= self.commit_seconds <= 1.0:
            problems.append("--commit-seconds must be between 0 and 1")
        if not self.render_timeout > 0:
            problems.append("--render-timeout must be > 0")
        if not 1 <= self.render_contexts <= 64:
            problems.append("--render-contexts must be between 1 and 64")
        if self.latency_factor < 0:
            problems.append("--latency-factor must be >= 0")
        if not self.fast_latency >= 0:
            problems.append("--fast-latency must be >= 0")
        if self.robots_max_age <= 0 or self.robots_error_ttl <= 0:
            problems.append("--robots-max-age and --robots-error-ttl must be > 0")
        if self.robots_max_attempts < 1:
            problems.append("--robots-max-attempts must be >= 1")
        if self.crawl_delay_cap < 0:
            problems.append("--crawl-delay-cap must be >= 0")
        if self.breaker_threshold < 1:
            problems.append("breaker_threshold must be >= 1")
        for name in ("max_depth", "max_url_length", "max_query_params", "max_repeated_segment"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_redirects < 0:
            problems.append("--max-redirects must be >= 0")
        if self.daily_budget is not None and self.daily_budget < 1:
            problems.append("--daily-budget must be >= 1")
        if not 0 < self.recrawl_min <= self.recrawl_max:
            problems.append("--recrawl-min must be > 0 and <= --recrawl-max")
        if self.tombstone_interval is not None and self.tombstone_interval <= 0:
            problems.append("--tombstone-interval must be > 0")
        if not 0 <= self.near_dup_distance <= 3:
            problems.append("--near-dup-distance must be between 0 and 3")
        if self.max_decompressed_bytes < 1 or self.max_bytes < 1:
            problems.append("--max-bytes and --max-decompressed-bytes must be >= 1")
        if not 0 <= self.warc_level <= 9:
            problems.append("--warc-level must be between 0 and 9")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            problems.append("--metrics-port must be a TCP port")
        if problems:
            raise ValueError("; ".join(problems))

    def trap_limits(self) -> TrapLimits:
        return TrapLimits(
            max_url_length=self.max_url_length,
            max_query_params=self.max_query_params,
            max_repeated_segment=self.max_repeated_segment,
            max_depth=self.max_depth,
            template_growth_limit=self.template_growth_limit,
            template_sample_every=self.template_sample_every,
        )

    def host_policy(self) -> HostPolicy:
        robots_cache = None
        if not self.ignore_robots:
            robots_cache = RobotsCache(
                RobotsSettings(
                    user_agent=self.user_agent,
                    max_age=self.robots_max_age,
                    error_ttl=self.robots_error_ttl,
                    crawl_delay_cap=self.crawl_delay_cap,
                )
            )
        return HostPolicy(
            max_in_flight=self.host_concurrency,
            delay=self.delay,
            latency_factor=self.latency_factor,
            fast_latency=self.fast_latency,
            backoff_base=self.backoff_base,
            backoff_cap=self.backoff_cap,
            retry_after_cap=self.retry_after_cap,
            breaker_threshold=self.breaker_threshold,
            breaker_seconds=self.breaker_seconds,
            robots=robots_cache,
            robots_max_attempts=self.robots_max_attempts,
            daily_budget=self.daily_budget,
        )

    def recrawl_policy(self) -> RecrawlPolicy:
        return RecrawlPolicy(
            min_interval=self.recrawl_min,
            max_interval=self.recrawl_max,
            tombstone_interval=self.tombstone_interval,
            pins=self.pins,
        )

    def leases_ahead(self) -> int:
        """``lease_ahead`` with its default resolved: as many as there are workers, so that a
        refill (when half of it is gone) is a call for about half of them, not one per idle
        worker. Fewer, larger lease calls cost the database less per page: on PostgreSQL the
        server's CPU per crawl was ~15 % lower than with half the workers (a median over nine
        interleaved ``bench crawl`` pairs, session 14), where a fleet sharing one server is
        bound by exactly that."""
        return self.concurrency if self.lease_ahead is None else self.lease_ahead

    def warc_directory(self) -> str:
        """Where WARC files go: ``warc_dir``, else ``<db>.warc`` next to an SQLite file."""
        if self.warc_dir:
            return self.warc_dir
        if "://" in self.db:
            return "idemcrawl-warc"
        return self.db + ".warc"


def default_of(name: str) -> Any:
    """The built-in default of the :class:`CrawlConfig` setting ``name``.

    Help texts and documentation read defaults through this instead of repeating them, so that
    changing a default here changes everything that shows it.
    """
    f = _FIELDS[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise KeyError(f"{name} has no default")


_FIELDS = {f.name: f for f in dataclasses.fields(CrawlConfig)}


class ConfigError(ValueError):
    """Settings that cannot be used; the one-line message names the flag or key at fault."""


class ConfigFileError(ConfigError):
    """A config file that cannot be used; the message names the file, line and key."""


#: Config-file keys (CLI flag names with ``_``) and the types they accept.
FILE_KEYS: dict[str, tuple[type, ...]] = {
    "db": (str,),
    "seeds": (list,),
    "sitemaps": (list,),
    "spider": (str,),
    "concurrency": (int,),
    "host_concurrency": (int,),
    "delay": (int, float),
    "lease_seconds": (int, float),
    "db_wait": (int, float),
    "lease_ahead": (int,),
    "scope": (str,),
    "allow_private": (list,),
    "max_pages": (int,),
    "horizon": (int, float),
    "requisites": (bool,),
    "render": (bool,),
    "render_timeout": (int, float),
    "render_contexts": (int,),
    "parse_workers": (int,),
    "commit_batch": (int,),
    "commit_seconds": (int, float),
    "max_retries": (int,),
    "user_agent": (str,),
    "latency_factor": (int, float),
    "fast_latency": (int, float),
    "ignore_robots": (bool,),
    "robots_max_age": (int, float),
    "robots_error_ttl": (int, float),
    "robots_max_attempts": (int,),
    "crawl_delay_cap": (int, float),
    "retry_deferred": (bool,),
    "max_depth": (int,),
    "max_url_length": (int,),
    "max_query_params": (int,),
    "max_repeated_segment": (int,),
    "template_growth_limit": (int,),
    "template_sample_every": (int,),
    "max_bytes": (int,),
    "max_decompressed_bytes": (int,),
    "max_redirects": (int,),
    "connect_timeout": (int, float),
    "read_timeout": (int, float),
    "total_timeout": (int, float),
    "parse_timeout": (int, float),
    "daily_budget": (int,),
    "recrawl": (bool,),
    "recrawl_min": (int, float),
    "recrawl_max": (int, float),
    "tombstone_interval": (int, float),
    "pins": (list,),
    "near_dup_distance": (int,),
    "warc": (bool,),
    "warc_dir": (str,),
    "warc_level": (int,),
    "metrics_port": (int,),
    "backoff_base": (int, float),
    "backoff_cap": (int, float),
    "retry_after_cap": (int, float),
    "breaker_threshold": (int,),
    "breaker_seconds": (int, float),
}
HOST_KEYS: dict[str, tuple[type, ...]] = {
    "delay": (int, float),
    "concurrency": (int,),
    "budget": (int,),
    "recrawl_interval": (int, float),
    "pins": (list,),
}


#: Crawl settings only the operator gives (flags, ``--config``), never a spider's
#: ``custom_settings``: what to crawl and where to store it, and the two that lift a safeguard.
OPERATOR_KEYS = frozenset(
    {"db", "db_wait", "seeds", "sitemaps", "spider", "ignore_robots", "allow_private"}
)


def _same(value: Any) -> Any:
    return value


def _zero_is_off(value: Any) -> Any:
    """Scrapy's 0 = "no limit": idemcrawl's own default stays (a trap defence, not a limit)."""
    return None if value == 0 and not isinstance(value, bool) else value


def _false_is(off: Any) -> Any:
    """An ``*_ENABLED`` setting: False sets ``off``, True keeps what idemcrawl does already."""

    def read(value: Any) -> Any:
        if not isinstance(value, bool):
            raise TypeError("must be True or False")
        return None if value else off

    return read


#: Scrapy settings a spider's ``custom_settings`` may give: the crawl setting each one sets and
#: how its value reads (None: nothing to set). docs/scrapy.md lists them.
SCRAPY_SETTINGS: dict[str, tuple[str, Any]] = {
    "DOWNLOAD_DELAY": ("delay", _same),
    "CONCURRENT_REQUESTS": ("concurrency", _same),
    "CONCURRENT_REQUESTS_PER_DOMAIN": ("host_concurrency", _same),
    "USER_AGENT": ("user_agent", _same),
    "DEPTH_LIMIT": ("max_depth", _zero_is_off),
    "CLOSESPIDER_PAGECOUNT": ("max_pages", _zero_is_off),
    "DOWNLOAD_TIMEOUT": ("total_timeout", _same),
    "DOWNLOAD_MAXSIZE": ("max_bytes", _zero_is_off),
    "RETRY_TIMES": ("max_retries", _same),
    "RETRY_ENABLED": ("max_retries", _false_is(0)),
    "REDIRECT_MAX_TIMES": ("max_redirects", _same),
    "REDIRECT_ENABLED": ("max_redirects", _false_is(0)),
    "AUTOTHROTTLE_ENABLED": ("latency_factor", _false_is(0)),
    "ROBOTSTXT_OBEY": ("ignore_robots", _false_is(True)),  # True; False is refused
}
_LOGS = (
    "the crawl's progress goes to stderr (--quiet, --json); self.logger is a standard "
    "logging.Logger (LOG_LEVEL and LOG_ENABLED set its level), set up with Python's logging"
)
#: Scrapy settings the spider itself applies (``parse.spider_log_level``), not the crawl.
SPIDER_OWN = frozenset({"LOG_LEVEL", "LOG_ENABLED"})
_EXPORT = "records are in the crawl database: idemcrawl export --db DB --format jsonl|csv|parquet"
_AUTOTHROTTLE = "the adaptive delay is latency_factor and fast_latency (--latency-factor)"
#: Scrapy settings refused with what to do instead: each names something idemcrawl does
#: differently or that is not a spider's to decide.
SCRAPY_REFUSED: dict[str, str] = {
    "COOKIES_ENABLED": "set keep_cookies = True or False on the spider",
    "LOG_FILE": _LOGS,
    "LOG_FORMAT": _LOGS,
    "LOG_STDOUT": _LOGS,
    "FEEDS": _EXPORT,
    "FEED_FORMAT": _EXPORT,
    "FEED_URI": _EXPORT,
    "FEED_EXPORT_ENCODING": _EXPORT,
    "FEED_EXPORT_FIELDS": _EXPORT,
    "ITEM_PIPELINES": "the spider's process_record() cleans records, record_schema validates",
    "HTTPCACHE_ENABLED": "every exchange is archived (WARC): idemcrawl reparse parses it again "
    "without the network",
    "JOBDIR": "every crawl resumes from its database (--db): rerun the same command",
    "DEFAULT_REQUEST_HEADERS": "give headers= to each Request",
    "DOWNLOADER_MIDDLEWARES": "idemcrawl has no middlewares: process_record() for records, "
    "Request(headers=…) for requests",
    "SPIDER_MIDDLEWARES": "idemcrawl has no middlewares: process_record() for records, "
    "Request(headers=…) for requests",
    "EXTENSIONS": "idemcrawl has no extensions",
    "CONCURRENT_REQUESTS_PER_IP": "politeness is per host: CONCURRENT_REQUESTS_PER_DOMAIN",
    "RANDOMIZE_DOWNLOAD_DELAY": "the delay is a minimum between a host's request starts, "
    "lengthened by the host's response times (latency_factor)",
    "AUTOTHROTTLE_START_DELAY": _AUTOTHROTTLE,
    "AUTOTHROTTLE_MAX_DELAY": _AUTOTHROTTLE,
    "AUTOTHROTTLE_TARGET_CONCURRENCY": _AUTOTHROTTLE,
    "AUTOTHROTTLE_DEBUG": _AUTOTHROTTLE,
}


def _fits(value: object, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def spider_settings(spider: type) -> dict[str, Any]:
    """The crawl settings a spider class asks for: its ``custom_settings`` (Scrapy names with
    an idemcrawl equivalent, or :data:`FILE_KEYS` names an operator does not keep to
    themselves) and, with ``allowed_domains``, ``scope = "any"`` (those domains then decide
    alone, as in Scrapy). :func:`layered_config` puts them above the built-in defaults and
    below the config file and the flags. A key that cannot be honoured is a ConfigError
    saying what to do instead: a spider's setting is never dropped without a word."""
    name = getattr(spider, "__name__", "spider")
    raw = getattr(spider, "custom_settings", None) or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name}.custom_settings must be a dict, got {type(raw).__name__}")
    out: dict[str, Any] = {}
    if getattr(spider, "allowed_domains", None):
        out["scope"] = "any"
    # "*_ENABLED": False last, so that RETRY_ENABLED False wins over RETRY_TIMES, as in Scrapy.
    for key in sorted(raw, key=lambda k: str(k).endswith("_ENABLED")):
        value = raw[key]
        where = f"{name}.custom_settings[{key!r}]"
        if (key == "ROBOTSTXT_OBEY" and value is False) or key in OPERATOR_KEYS:
            raise ConfigError(
                f"{where}: robots.txt is obeyed, and only the operator can turn that off "
                "(crawl --ignore-robots)"
                if key in ("ROBOTSTXT_OBEY", "ignore_robots")
                else f"{where}: {key} is the operator's to give (a crawl flag or --config)"
            )
        if key in SPIDER_OWN:
            continue  # the spider's logger level (checked when the spider loads)
        if key in SCRAPY_REFUSED:
            raise ConfigError(f"{where} has no idemcrawl equivalent: {SCRAPY_REFUSED[key]}")
        if key in SCRAPY_SETTINGS:
            target, read = SCRAPY_SETTINGS[key]
            try:
                value = read(value)
            except TypeError as exc:
                raise ConfigError(f"{where} {exc}, got {value!r}") from None
            if value is None:
                continue
        elif key in FILE_KEYS:
            target = key
        else:
            own = sorted(set(FILE_KEYS) - OPERATOR_KEYS)
            raise ConfigError(
                f"{where}: unknown setting; custom_settings takes the Scrapy settings "
                f"{', '.join(SCRAPY_SETTINGS)} or the idemcrawl crawl settings {', '.join(own)}"
            )
        types = FILE_KEYS[target]
        if not _fits(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"{where} must be {names}, got {value!r}")
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"{where} must be >= 0, got {value!r}")
        out[target] = value
    return out


def _line_of(text: str, key: str) -> int | None:
    import re

    m = re.search(rf'^[ \t]*"?{re.escape(key)}"?[ \t]*=', text, re.M)
    if m is None:
        m = re.search(rf"^[ \t]*\[.*{re.escape(key)}.*\]", text, re.M)
    return None if m is None else text.count("\n", 0, m.start()) + 1


def host_keys_for(host: str) -> list[str]:
    """``scheme://host[:port]`` as given, or both schemes for a bare ``host[:port]``."""
    targets = [host] if "://" in host else [f"http://{host}", f"https://{host}"]
    try:
        return [urls.host_key(urls.normalise(t)) for t in targets]
    except urls.InvalidURL as exc:
        raise ValueError(f"bad host {host!r}: {exc}") from None


def load_config_file(
    path: str,
) -> tuple[dict[str, object], list[tuple[str, float | None, int | None]]]:
    """Read a TOML crawl config: top-level crawl settings plus ``[hosts."HOST"]`` overrides.

    Unknown keys and values of the wrong type are rejected, naming the file and line, because a
    typo in a politeness setting silently falling back to a default is worse than no start.
    """
    import re
    import tomllib

    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigFileError(f"cannot read config file {path}: {exc.strerror}") from None
    text = raw.decode("utf-8", "replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: {exc}") from None

    def where(key: str) -> str:
        line = _line_of(text, key)
        return f"{path}:{line}" if line else path

    def check(key: str, value: object, types: tuple[type, ...]) -> None:
        if not _fits(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigFileError(f"{where(key)}: {key} must be {names}, got {value!r}")

    settings: dict[str, object] = {}
    overrides: list[tuple[str, float | None, int | None]] = []
    for key, value in data.items():
        if key == "hosts":
            if not isinstance(value, dict):
                raise ConfigFileError(f"{where('hosts')}: [hosts] must be a table of hosts")
            for host, table in value.items():
                if not isinstance(table, dict):
                    raise ConfigFileError(f"{where(host)}: hosts.{host} must be a table")
                for k, v in table.items():
                    if k not in HOST_KEYS:
                        raise ConfigFileError(
                            f"{where(k)}: unknown key {k!r} in [hosts.{host!r}] "
                            f"(known: {', '.join(sorted(HOST_KEYS))})"
                        )
                    check(k, v, HOST_KEYS[k])
                try:
                    keys = host_keys_for(host)
                except ValueError as exc:
                    raise ConfigFileError(f"{where(host)}: {exc}") from None
                for k in ("delay", "recrawl_interval"):
                    if k in table and table[k] < 0:
                        raise ConfigFileError(f"{where(k)}: {k} must be >= 0, got {table[k]!r}")
                for k in ("concurrency", "budget"):
                    if k in table and table[k] < 1:
                        raise ConfigFileError(f"{where(k)}: {k} must be >= 1, got {table[k]!r}")
                for hk in keys:
                    delay = table.get("delay")
                    conc = table.get("concurrency")
                    if delay is not None or conc is not None:
                        overrides.append(
                            (hk, None if delay is None else float(delay), conc)  # type: ignore[arg-type]
                        )
                    if "budget" in table:
                        budgets = settings.setdefault("host_budgets", [])
                        budgets.append((hk, int(table["budget"])))  # type: ignore[union-attr]
                    pins = settings.setdefault("host_pins", [])
                    if "recrawl_interval" in table:
                        pins.append(f"^{re.escape(hk)}/={float(table['recrawl_interval'])}")  # type: ignore[union-attr]
                    for pin in table.get("pins", []):
                        pins.append(str(pin))  # type: ignore[union-attr]
            continue
        if key not in FILE_KEYS:
            raise ConfigFileError(f"{where(key)}: unknown key {key!r}")
        check(key, value, FILE_KEYS[key])
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and value < 0
            and key not in ("metrics_port",)
        ):
            raise ConfigFileError(f"{where(key)}: {key} must be >= 0, got {value!r}")
        if key == "pins":
            for pin in value:  # type: ignore[union-attr]
                try:
                    parse_pin(str(pin))
                except PinError as exc:
                    raise ConfigFileError(f"{where(key)}: {exc}") from None
        settings[key] = value
    return settings, overrides


@dataclass(frozen=True)
class FlagLists:
    """Repeatable flags, which add to what the config file says instead of replacing it.

    Each item is the flag's text as typed: ``sitemaps`` URLs, ``pins`` ``REGEX=SECONDS``,
    ``host_delays`` ``HOST=SECONDS``, ``host_maxes`` and ``host_budgets`` ``HOST=N``; a per-host
    flag beats the file's ``[hosts."HOST"]`` table for that host.
    """

    sitemaps: Sequence[str] = ()
    pins: Sequence[str] = ()
    host_delays: Sequence[str] = ()
    host_maxes: Sequence[str] = ()
    host_budgets: Sequence[str] = ()


def layered_config(
    path: str | None,
    given: Mapping[str, Any],
    lists: FlagLists | None = None,
    load_spider: Callable[[str], type] | None = None,
) -> CrawlConfig:
    """Defaults, then the spider's settings (:func:`spider_settings`), then the config file at
    ``path``, then the settings ``given`` on the command line: the operator's word is last.
    The spider's settings are read through ``load_spider`` (``parse.load_spider``, as ``crawl``
    passes it; without it a spider's ``custom_settings`` and ``allowed_domains`` do not apply).

    ``given`` holds only flags the user actually typed, under their :data:`FILE_KEYS` names
    (``seeds`` for seed URLs); each replaces the file's value. Returns a validated config, or
    raises :class:`ConfigError` (or :class:`~idemcrawl.url.InvalidURL` for a bad seed or sitemap
    URL) with a one-line message naming the flag or key, before anything touches the network
    or the database.
    """
    lists = lists or FlagLists()
    unknown = sorted(set(given) - set(FILE_KEYS))
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
    settings: dict[str, Any] = {}
    overrides: list[tuple[str, float | None, int | None]] = []
    if path:
        settings, overrides = load_config_file(path)
    spider = given.get("spider", settings.get("spider"))
    if spider and load_spider is not None:
        # The spider API (parse.py) stands above this module: its loader is handed in
        # (SpiderLoadError names the spider's own problem).
        settings = {**spider_settings(load_spider(str(spider))), **settings}
    settings.update(given)
    table: dict[str, list[Any]] = {h: [d, m] for h, d, m in overrides}
    for slot, flag, items in (
        (0, "--host-delay", lists.host_delays),
        (1, "--host-max", lists.host_maxes),
    ):
        for item in items:
            keys, number = parse_host_flag(flag, item, integer=slot == 1)
            for hk in keys:
                table.setdefault(hk, [None, None])[slot] = number
    budgets: dict[str, int] = dict(settings.pop("host_budgets", []))
    for item in lists.host_budgets:
        keys, n = parse_host_flag("--host-budget", item, integer=True)
        budgets.update(dict.fromkeys(keys, int(n)))
    pins_text = [str(x) for x in [*settings.pop("pins", []), *settings.pop("host_pins", [])]]
    try:
        pins = tuple(parse_pin(x) for x in [*pins_text, *lists.pins])
    except PinError as exc:
        raise ConfigError(str(exc)) from None
    if "db" not in settings:
        raise ConfigError('--db is required (or db = "PATH" in the config file)')
    seeds = [str(u) for u in settings.pop("seeds", [])]
    sitemaps = [str(u) for u in [*settings.pop("sitemaps", []), *lists.sitemaps]]
    for u in seeds + sitemaps:
        urls.normalise(u)  # raises InvalidURL naming the offending URL
    if (
        not seeds
        and not sitemaps
        and not settings.get("spider")  # its start_urls / start_requests (checked by crawl)
        and not os.path.exists(str(settings["db"]))
    ):
        raise ConfigError(
            f"no seed URLs given and no crawl database at {settings['db']!r} to resume"
        )
    try:
        allow = parse_allow_list([str(x) for x in settings.pop("allow_private", [])])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cfg = CrawlConfig(
        seeds=tuple(seeds),
        sitemaps=tuple(sitemaps),
        allow_private=allow,
        host_overrides=tuple((h, v[0], v[1]) for h, v in table.items()),
        host_budgets=tuple(budgets.items()),
        pins=pins,
        **settings,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return cfg


def parse_host_flag(flag: str, item: str, *, integer: bool) -> tuple[list[str], float | int]:
    """``HOST=VALUE`` of a per-host flag → (the host keys it names, the value).

    A bare ``host[:port]`` names both its http and https host keys. Delays must be >= 0,
    counts (``integer``) >= 1.
    """
    host, sep, value = item.rpartition("=")
    if not sep or not host:
        raise ConfigError(f"{flag} takes HOST=VALUE, got {item!r}")
    try:
        number: float | int = int(value) if integer else float(value)
    except ValueError:
        raise ConfigError(f"{flag} {item!r}: {value!r} is not a number") from None
    if number < 0 or (integer and number < 1):
        raise ConfigError(f"{flag} {item!r}: value out of range")
    try:
        keys = host_keys_for(host)
    except ValueError as exc:
        raise ConfigError(f"{flag} {item!r}: {exc}") from None
    return keys, number
