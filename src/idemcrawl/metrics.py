"""Prometheus metrics (R24): read from the frontier at scrape time, plus a few live gauges.

Why scrape-time reads instead of counters kept in memory: several crawl processes on several
machines share one frontier, and any of them may be killed at any instant. A counter in one
process's memory would be that process's share and would restart at 0 on every resume; the
frontier's counters, URL states and lease log are the crawl's truth across processes and
restarts. So the collector reads them (cached ~1 s, so a scrape costs at most one frontier read
per second however many scrapers there are) and only the numbers that exist nowhere but in the
crawling process (parser backlog, this process's in-flight and rates) come from
:class:`LiveGauges`, which the engine sets.

The registry is our own, never prometheus-client's global one: importing this module must not
change what another library's ``/metrics`` shows, and tests can start several servers.

Every metric is declared once in :data:`METRICS`; docs/metrics.md is that table (a test keeps
them equal) and the collector takes help texts from it, so names and docs cannot drift.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .frontier import open_frontier
from .frontier.base import STATES, FrontierStats

__all__ = [
    "ELIGIBILITY_BUCKETS",
    "METRICS",
    "STATUS_CLASSES",
    "FrontierCollector",
    "FrontierView",
    "LiveGauges",
    "MetricSpec",
    "MetricsServer",
    "build_families",
    "host_summary",
    "make_registry",
    "markdown_table",
    "read_frontier",
    "start_metrics_server",
]

#: Only loopback: the numbers describe what a crawl is doing and to whom.
BIND_ADDRESS = "127.0.0.1"

#: Response classes counted by the frontier (counter ``status_<class>``).
STATUS_CLASSES: tuple[str, ...] = ("2xx", "3xx", "304", "4xx", "429", "5xx")

#: Upper bounds (seconds) of the eligibility-delay histogram: from "leased at once" to "a host's
#: queue waited minutes" (a long Crawl-delay or back-off).
ELIGIBILITY_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    math.inf,
)

#: The frontier method the histogram needs (not every backend has it yet); see read_frontier.
HISTOGRAM_METHOD = "eligibility_delay_histogram"

Source = Literal["frontier", "process"]
Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # as exposed; counters end in _total
    kind: Kind
    labels: tuple[str, ...]
    help: str
    source: Source  # frontier: true across processes; process: this process only
    requires: str | None = None  # a frontier method some backends may lack


def _m(name: str, kind: Kind, help: str, *labels: str, source: Source = "frontier") -> MetricSpec:
    return MetricSpec(name, kind, labels, help, source)


METRICS: tuple[MetricSpec, ...] = (
    _m("idemcrawl_frontier_up", "gauge", "1 if this scrape could read the crawl database"),
    _m("idemcrawl_frontier_read_seconds", "gauge", "Time the last frontier read took"),
    _m("idemcrawl_urls", "gauge", "Known URLs by frontier state", "state"),
    _m("idemcrawl_hosts", "gauge", "Hosts known to the frontier"),
    _m(
        "idemcrawl_hosts_ready",
        "gauge",
        "Hosts with queued URLs, neither paused nor backing off (at most waiting for their gap)",
    ),
    _m("idemcrawl_hosts_in_backoff", "gauge", "Hosts currently backing off after errors"),
    _m("idemcrawl_hosts_paused", "gauge", "Hosts paused or blocked by an operator"),
    _m("idemcrawl_crawl_paused", "gauge", "1 while an operator has paused the whole crawl"),
    _m("idemcrawl_records", "gauge", "Records stored"),
    _m("idemcrawl_index_events", "gauge", "Index events emitted"),
    _m("idemcrawl_fetches_total", "counter", "Fetches committed by all processes, errors included"),
    _m("idemcrawl_fetch_errors_total", "counter", "Fetches that ended in an error"),
    _m("idemcrawl_fetched_bytes_total", "counter", "Response body bytes fetched"),
    _m(
        "idemcrawl_responses_total",
        "counter",
        "HTTP responses by status class (disjoint: 3xx excludes 304, 4xx excludes 429)",
        "class",
    ),
    _m(
        "idemcrawl_response_ratio",
        "gauge",
        "Share of fetches per status class (responses_total / fetches_total)",
        "class",
    ),
    _m(
        "idemcrawl_requests_per_record",
        "gauge",
        "Fetches per stored record (NaN while no record is stored)",
    ),
    _m(
        "idemcrawl_politeness_violations",
        "gauge",
        "Lease grants that broke a host's allowance, recomputed from the lease log; must stay 0",
    ),
    _m("idemcrawl_lease_grants_total", "counter", "Leases granted (lease log)"),
    MetricSpec(
        "idemcrawl_eligibility_delay_seconds",
        "histogram",
        (),
        "Delay from a URL becoming due to its lease being granted (lease log)",
        "frontier",
        requires=HISTOGRAM_METHOD,
    ),
    _m(
        "idemcrawl_eligibility_delay_quantile_seconds",
        "gauge",
        "Eligibility delay percentiles over the last 100000 grants (quantile 0.5, 0.99, 1 = max)",
        "quantile",
    ),
    _m("idemcrawl_lease_expiries_total", "counter", "Leases that expired before completion"),
    _m(
        "idemcrawl_leases_reclaimed_total",
        "counter",
        "Leases returned at once because their owner process was found dead",
    ),
    _m(
        "idemcrawl_completions_rejected_total",
        "counter",
        "Completions refused because their lease was stale (harmless duplicates)",
    ),
    _m("idemcrawl_retries_total", "counter", "Fetches scheduled again after a transient error"),
    _m("idemcrawl_links_new_total", "counter", "Discovered links that were new URLs"),
    _m("idemcrawl_url_duplicates_total", "counter", "Discovered links that were already known"),
    _m(
        "idemcrawl_url_duplicate_ratio",
        "gauge",
        "url_duplicates / (url_duplicates + links_new)",
    ),
    _m(
        "idemcrawl_links_rejected_total",
        "counter",
        "Discovered links not followed, by reason (scope, trap defences)",
        "reason",
    ),
    _m(
        "idemcrawl_content_duplicates_total",
        "counter",
        "Fetched bodies byte-identical to one already stored",
    ),
    _m("idemcrawl_near_duplicates_total", "counter", "Fetched pages near-identical (SimHash)"),
    _m(
        "idemcrawl_content_duplicate_ratio",
        "gauge",
        "content_duplicates / 2xx responses (fetches when status classes are not counted)",
    ),
    _m(
        "idemcrawl_robots_cache_age_seconds",
        "gauge",
        "Age of the cached robots.txt copies over hosts (stat = max or median)",
        "stat",
    ),
    _m("idemcrawl_robots_fetches_total", "counter", "robots.txt fetches"),
    _m("idemcrawl_robots_disallowed_total", "counter", "URLs refused by robots.txt rules"),
    _m("idemcrawl_urls_deferred_total", "counter", "URLs set aside for a host-level reason"),
    _m("idemcrawl_host_backoffs_total", "counter", "Host back-offs started"),
    _m("idemcrawl_breaker_trips_total", "counter", "Host circuit breakers tripped"),
    _m(
        "idemcrawl_trap_budget_triggers_total",
        "counter",
        "Times a host's daily page budget stopped further URLs",
    ),
    _m(
        "idemcrawl_trap_template_pauses_total",
        "counter",
        "Times a URL template was paused as a likely trap",
    ),
    _m(
        "idemcrawl_parser_backlog",
        "gauge",
        "Pages fetched by this process and waiting for a parser",
        source="process",
    ),
    _m(
        "idemcrawl_process_in_flight",
        "gauge",
        "Leases this process holds and has not committed",
        source="process",
    ),
    _m(
        "idemcrawl_process_pages_per_second",
        "gauge",
        "Pages/s fetched by this process (recent window)",
        source="process",
    ),
    _m(
        "idemcrawl_process_bytes_per_second",
        "gauge",
        "Body bytes/s fetched by this process (recent window)",
        source="process",
    ),
)

_SPEC = {s.name: s for s in METRICS}

#: Frontier counter -> exposed counter (missing counters read as 0: older databases lack them).
_COUNTERS: dict[str, str] = {
    "idemcrawl_fetches_total": "fetches",
    "idemcrawl_fetch_errors_total": "fetch_errors",
    "idemcrawl_fetched_bytes_total": "bytes_fetched",
    "idemcrawl_leases_reclaimed_total": "leases_reclaimed",
    "idemcrawl_completions_rejected_total": "completions_rejected",
    "idemcrawl_retries_total": "retries",
    "idemcrawl_links_new_total": "links_new",
    "idemcrawl_url_duplicates_total": "url_duplicates",
    "idemcrawl_content_duplicates_total": "content_duplicates",
    "idemcrawl_near_duplicates_total": "near_duplicates",
    "idemcrawl_robots_fetches_total": "robots_fetches",
    "idemcrawl_robots_disallowed_total": "robots_disallowed",
    "idemcrawl_urls_deferred_total": "urls_deferred",
    "idemcrawl_host_backoffs_total": "host_backoffs",
    "idemcrawl_breaker_trips_total": "breaker_trips",
    "idemcrawl_trap_budget_triggers_total": "budget_exhausted",
    "idemcrawl_trap_template_pauses_total": "template_paused",
}


def markdown_table() -> str:
    """The metrics table of docs/metrics.md, generated from :data:`METRICS`."""
    rows = [
        "| name | type | labels | source | help |",
        "|---|---|---|---|---|",
    ]
    for s in METRICS:
        labels = ", ".join(s.labels) or "-"
        src = s.source + (f" (needs `{s.requires}`)" if s.requires else "")
        rows.append(f"| `{s.name}` | {s.kind} | {labels} | {src} | {s.help} |")
    return "\n".join(rows) + "\n"


@dataclass(slots=True)
class LiveGauges:
    """Numbers only the crawling process knows; the engine assigns them, scrapes read them.

    Plain attribute writes are atomic in CPython, so the engine's event loop can set them
    without a lock while the metrics server's threads read them.
    """

    parser_backlog: int = 0
    in_flight: int = 0
    pages_per_second: float = 0.0
    bytes_per_second: float = 0.0


@dataclass(slots=True)
class FrontierView:
    """One read of the frontier: what every frontier-sourced metric is computed from."""

    stats: FrontierStats
    hosts: list[dict[str, Any]]
    audit: dict[str, Any]
    now: float
    histogram: dict[str, Any] | None = None
    read_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def read_frontier(frontier: Any, now: float | None = None) -> FrontierView:
    """Read stats, per-host states and the lease audit from an open frontier.

    The eligibility histogram comes from ``frontier.eligibility_delay_histogram(bounds)`` when the
    backend has it: ``{"counts": [cumulative grants with delay <= bound, one per bound, the
    last bound being +inf], "sum": total delay seconds}`` over the whole lease log.
    """
    t0 = time.perf_counter()
    now = time.time() if now is None else now
    stats = frontier.stats()
    hosts = frontier.hosts_report(now)
    audit = frontier.lease_audit()
    hist_fn: Callable[[Sequence[float]], dict[str, Any]] | None = getattr(
        frontier, HISTOGRAM_METHOD, None
    )
    histogram = hist_fn(ELIGIBILITY_BUCKETS) if hist_fn is not None else None
    return FrontierView(stats, hosts, audit, now, histogram, time.perf_counter() - t0)


def host_summary(hosts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Hosts ready / in back-off / paused, from ``hosts_report`` rows (progress and metrics)."""
    ready = backoff = paused = 0
    for h in hosts:
        in_backoff = bool(h.get("in_backoff"))
        is_paused = bool(h.get("paused"))
        backoff += in_backoff
        paused += is_paused
        # Not "may lease this instant": a leaser takes such a host at once, so that count is
        # nearly always 0. What an operator wants is how many hosts have work and are not held.
        if h.get("queued", 0) > 0 and not in_backoff and not is_paused:
            ready += 1
    return {"ready": ready, "backoff": backoff, "paused": paused}


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def _pct(v: Any) -> float:
    return math.nan if v is None else float(v)


def _family(name: str) -> CounterMetricFamily | GaugeMetricFamily:
    spec = _SPEC[name]
    if spec.kind == "counter":
        return CounterMetricFamily(name, spec.help, labels=list(spec.labels))
    return GaugeMetricFamily(name, spec.help, labels=list(spec.labels))


def _single(name: str, value: float) -> Metric:
    fam = _family(name)
    fam.add_metric([], value)
    return fam


def build_families(
    view: FrontierView | None, live: LiveGauges | None, *, up: bool = True
) -> list[Metric]:
    """Every metric from one frontier view and the live gauges (pure: easy to test)."""
    out: list[Metric] = [_single("idemcrawl_frontier_up", 1.0 if up and view else 0.0)]
    if view is not None:
        out.extend(_frontier_families(view))
    if live is not None:
        out.append(_single("idemcrawl_parser_backlog", live.parser_backlog))
        out.append(_single("idemcrawl_process_in_flight", live.in_flight))
        out.append(_single("idemcrawl_process_pages_per_second", live.pages_per_second))
        out.append(_single("idemcrawl_process_bytes_per_second", live.bytes_per_second))
    return out


def _frontier_families(v: FrontierView) -> Iterator[Metric]:
    c = v.stats.counters

    def n(key: str) -> int:
        return int(c.get(key, 0) or 0)

    yield _single("idemcrawl_frontier_read_seconds", v.read_seconds)
    urls = _family("idemcrawl_urls")
    for state in dict.fromkeys([*STATES, *v.stats.urls_by_state]):
        urls.add_metric([state], v.stats.urls_by_state.get(state, 0))
    yield urls
    hs = host_summary(v.hosts)
    yield _single("idemcrawl_hosts", v.stats.hosts)
    yield _single("idemcrawl_hosts_ready", hs["ready"])
    yield _single("idemcrawl_hosts_in_backoff", hs["backoff"])
    yield _single("idemcrawl_hosts_paused", hs["paused"])
    yield _single("idemcrawl_crawl_paused", 1.0 if v.stats.meta.get("paused") == "1" else 0.0)
    yield _single("idemcrawl_records", v.stats.records)
    yield _single("idemcrawl_index_events", v.stats.events)
    for name, key in _COUNTERS.items():
        yield _single(name, n(key))
    fetches = n("fetches")
    responses = _family("idemcrawl_responses_total")
    ratios = _family("idemcrawl_response_ratio")
    for cls in STATUS_CLASSES:
        responses.add_metric([cls], n(f"status_{cls}"))
        ratios.add_metric([cls], _ratio(n(f"status_{cls}"), fetches))
    yield responses
    yield ratios
    yield _single("idemcrawl_requests_per_record", _ratio(fetches, v.stats.records))
    audit = v.audit
    yield _single("idemcrawl_politeness_violations", audit.get("violations", 0))
    yield _single("idemcrawl_lease_grants_total", audit.get("grants", 0))
    if v.histogram is not None:
        counts = list(v.histogram["counts"])
        if len(counts) != len(ELIGIBILITY_BUCKETS):
            raise ValueError(
                f"{HISTOGRAM_METHOD} returned {len(counts)} counts for "
                f"{len(ELIGIBILITY_BUCKETS)} buckets"
            )
        buckets = [
            ("+Inf" if math.isinf(b) else repr(b), float(k))
            for b, k in zip(ELIGIBILITY_BUCKETS, counts, strict=True)
        ]
        yield HistogramMetricFamily(
            "idemcrawl_eligibility_delay_seconds",
            _SPEC["idemcrawl_eligibility_delay_seconds"].help,
            buckets=buckets,
            sum_value=float(v.histogram["sum"]),
        )
    pct = audit.get("eligibility_delay_s") or {}
    q = _family("idemcrawl_eligibility_delay_quantile_seconds")
    for label, key in (("0.5", "p50"), ("0.99", "p99"), ("1", "max")):
        q.add_metric([label], _pct(pct.get(key)))
    yield q
    # Older databases count "lease_expiries"; "leases_expired" is the newer name. One event
    # bumps whichever exists, or both, so the larger is the count either way.
    yield _single("idemcrawl_lease_expiries_total", max(n("lease_expiries"), n("leases_expired")))
    yield _single(
        "idemcrawl_url_duplicate_ratio",
        _ratio(n("url_duplicates"), n("url_duplicates") + n("links_new")),
    )
    rejected = _family("idemcrawl_links_rejected_total")
    for key in sorted(c):
        if key.startswith("links_rejected_"):
            rejected.add_metric([key.removeprefix("links_rejected_")], n(key))
    yield rejected
    ok = n("status_2xx") if "status_2xx" in c else fetches
    yield _single("idemcrawl_content_duplicate_ratio", _ratio(n("content_duplicates"), ok))
    ages = [float(h["robots_age_s"]) for h in v.hosts if h.get("robots_age_s") is not None]
    age = _family("idemcrawl_robots_cache_age_seconds")
    age.add_metric(["max"], max(ages) if ages else math.nan)
    age.add_metric(["median"], statistics.median(ages) if ages else math.nan)
    yield age


class FrontierCollector(Collector):
    """Reads the frontier on scrape (at most once per ``cache_seconds``) and yields METRICS.

    The frontier is opened lazily and kept open between scrapes; if a read fails (database not
    created yet, locked, server gone) the scrape still answers, with ``idemcrawl_frontier_up 0``
    and the process gauges, and the next scrape reopens the database.
    """

    def __init__(
        self,
        db: str,
        live: LiveGauges | None = None,
        *,
        cache_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.live = live
        self.cache_seconds = cache_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._frontier: Any = None
        self._view: FrontierView | None = None
        self._read_at = -math.inf
        self._ok = False
        self.last_error: str | None = None
        self.reads = 0

    def _refresh(self) -> None:
        try:
            if self._frontier is None:
                self._frontier = open_frontier(self.db, create=False)
            self._view = read_frontier(self._frontier)
            self._ok = True
            self.last_error = None
            self.reads += 1
        except Exception as exc:  # any backend's error: report it as frontier_up 0
            self._ok = False
            self._view = None
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._close_frontier()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self._clock() - self._read_at >= self.cache_seconds:
                self._refresh()
                self._read_at = self._clock()
            view, ok = self._view, self._ok
        return iter(build_families(view, self.live, up=ok))

    def _close_frontier(self) -> None:
        f, self._frontier = self._frontier, None
        if f is not None:
            with contextlib.suppress(Exception):  # already broken; nothing more to release
                f.close()

    def close(self) -> None:
        with self._lock:
            self._close_frontier()


def make_registry(
    db: str, live: LiveGauges | None = None, *, cache_seconds: float = 1.0
) -> tuple[CollectorRegistry, FrontierCollector]:
    """A private registry holding only idemcrawl's collector."""
    registry = CollectorRegistry(auto_describe=False)
    collector = FrontierCollector(db, live, cache_seconds=cache_seconds)
    registry.register(collector)
    return registry, collector


class MetricsServer:
    """A running ``/metrics`` endpoint on 127.0.0.1; ``close()`` stops it and frees the port."""

    def __init__(self, db: str, port: int, live: LiveGauges | None) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"metrics port must be 0..65535, not {port}")
        self.registry, self.collector = make_registry(db, live)
        try:
            self._httpd, self._thread = start_http_server(
                port, addr=BIND_ADDRESS, registry=self.registry
            )
        except OSError as exc:
            self.collector.close()
            raise OSError(
                f"cannot serve metrics on {BIND_ADDRESS}:{port}: {exc.strerror or exc}"
            ) from exc
        self.port: int = self._httpd.server_port
        self.url = f"http://{BIND_ADDRESS}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        self.collector.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def start_metrics_server(db: str, port: int, live: LiveGauges | None = None) -> MetricsServer:
    """Serve Prometheus text format for crawl ``db`` on 127.0.0.1:``port`` (0 = any free port)."""
    return MetricsServer(db, port, live)
