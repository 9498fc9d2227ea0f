"""Prometheus metrics: a real crawl of the multi-host site, scraped over loopback."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from idemcrawl.engine import run_crawl
from idemcrawl.frontier import SQLiteFrontier, open_frontier
from idemcrawl.frontier.base import FrontierStats
from idemcrawl.lab.testsite import ShopConfig, ShopServer
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer
from idemcrawl.metrics import (
    ELIGIBILITY_BUCKETS,
    METRICS,
    FrontierCollector,
    FrontierView,
    LiveGauges,
    build_families,
    host_summary,
    make_registry,
    markdown_table,
    start_metrics_server,
)
from idemcrawl.status import status_dict

from .conftest import crawl_config

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


@pytest.fixture(scope="module")
def crawl_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A finished crawl of three hosts: pages, robots rules, a 429/503/500 host, records."""
    db = tmp_path_factory.mktemp("metrics") / "crawl.db"
    specs = [
        HostSpec("a", pages=6, status_pages=True),
        HostSpec("b", pages=6),
        HostSpec("c", pages=4, robots="none"),
    ]
    with MultiHostServer(specs) as site:
        summary = run_crawl(
            crawl_config(
                db,
                site.seed_urls[0],
                seeds=tuple(site.seed_urls),
                spider="idemcrawl.lab.testsite.page_spider:PageSpider",
                host_concurrency=1,
                delay=0.0,
                retry_base=0.05,  # keep the retries of /always500 and the back-offs short
                backoff_base=0.05,
                max_retries=2,
            )
        )
    assert summary.finished
    yield str(db)


def scrape(url: str) -> tuple[str, dict[str, Any]]:
    with _OPENER.open(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return text, {f.name: f for f in text_string_to_metric_families(text)}


def exposed_name(family: Any) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    fam = families[name.removesuffix("_total")]
    hits = [s.value for s in fam.samples if s.name == name and s.labels == labels]
    assert len(hits) == 1, (name, labels, fam.samples)
    return float(hits[0])


def test_every_documented_metric_is_scraped_with_real_values(crawl_db: str) -> None:
    live = LiveGauges(parser_backlog=4, in_flight=2, pages_per_second=3.5, bytes_per_second=1e3)
    with start_metrics_server(crawl_db, 0, live) as server:
        assert server._httpd.server_address[0] == "127.0.0.1"  # loopback only
        _, fams = scrape(server.url)
    status = status_dict(crawl_db)
    f = open_frontier(crawl_db, create=False)
    counters = f.stats().counters
    f.close()

    names = {exposed_name(fam) for fam in fams.values()}
    for spec in METRICS:
        if spec.requires and not hasattr(SQLiteFrontier, spec.requires):
            continue  # documented as needing a frontier method this backend lacks yet
        assert spec.name in names, spec.name
        fam = fams[spec.name.removesuffix("_total")]
        assert fam.type == spec.kind and fam.documentation == spec.help

    assert value(fams, "idemcrawl_frontier_up") == 1
    fetches = value(fams, "idemcrawl_fetches_total")
    assert fetches == status["requests"] > 0
    assert value(fams, "idemcrawl_responses_total", **{"class": "2xx"}) > 0
    assert value(fams, "idemcrawl_responses_total", **{"class": "429"}) > 0  # /limited
    assert value(fams, "idemcrawl_responses_total", **{"class": "5xx"}) > 0  # /unavailable
    assert value(fams, "idemcrawl_fetched_bytes_total") == counters["bytes_fetched"] > 0
    assert value(fams, "idemcrawl_politeness_violations") == 0
    assert value(fams, "idemcrawl_lease_grants_total") == status["politeness"]["grants"] > 0
    for state, n in status["urls"].items():
        assert value(fams, "idemcrawl_urls", state=state) == n
    assert value(fams, "idemcrawl_urls", state="done") > 0
    assert value(fams, "idemcrawl_records") == status["records"] > 0
    assert value(fams, "idemcrawl_requests_per_record") == pytest.approx(
        status["requests_per_record"], rel=1e-3
    )
    assert value(fams, "idemcrawl_retries_total") == counters["retries"] > 0
    assert value(fams, "idemcrawl_url_duplicates_total") == counters["url_duplicates"] > 0
    dup = value(fams, "idemcrawl_url_duplicate_ratio")
    assert dup == pytest.approx(
        counters["url_duplicates"] / (counters["url_duplicates"] + counters["links_new"])
    )
    assert value(fams, "idemcrawl_robots_disallowed_total") == status["robots_disallowed"] > 0
    ages = [h["robots_age_s"] for h in status["host_states"] if h["robots_age_s"] is not None]
    age_max = value(fams, "idemcrawl_robots_cache_age_seconds", stat="max")
    age_median = value(fams, "idemcrawl_robots_cache_age_seconds", stat="median")
    assert 0 < age_median <= age_max <= max(ages) + 0.5
    pct = status["politeness"]["eligibility_delay_s"]
    for q, key in (("0.5", "p50"), ("0.99", "p99"), ("1", "max")):
        assert value(fams, "idemcrawl_eligibility_delay_quantile_seconds", quantile=q) == pct[key]
    ratios = sum(
        value(fams, "idemcrawl_response_ratio", **{"class": c})
        for c in ("2xx", "3xx", "304", "4xx", "429", "5xx")
    )
    assert 0 < ratios <= 1  # disjoint classes; fetches without a response are in neither
    assert value(fams, "idemcrawl_hosts") == status["hosts"] == 3
    assert value(fams, "idemcrawl_parser_backlog") == 4
    assert value(fams, "idemcrawl_process_in_flight") == 2
    assert value(fams, "idemcrawl_process_pages_per_second") == 3.5


def test_docs_table_is_the_metric_catalogue() -> None:
    assert markdown_table() in DOCS.read_text(encoding="utf-8")
    assert len({s.name for s in METRICS}) == len(METRICS)
    for s in METRICS:
        assert s.name.startswith("idemcrawl_")
        assert s.name.endswith("_total") == (s.kind == "counter"), s.name


def view(**kw: Any) -> FrontierView:
    base: dict[str, Any] = dict(
        stats=FrontierStats(urls_by_state={"done": 3}, hosts=1, records=0, counters={}),
        hosts=[],
        audit={"grants": 0, "violations": 0, "eligibility_delay_s": {}},
        now=1000.0,
    )
    base.update(kw)
    return FrontierView(**base)


class Fixed(Collector):
    def __init__(self, v: FrontierView | None, up: bool = True) -> None:
        self.v, self.up = v, up

    def collect(self) -> Iterator[Any]:
        return iter(build_families(self.v, None, up=self.up))


def exposition(v: FrontierView | None, up: bool = True) -> dict[str, Any]:
    reg = CollectorRegistry()
    reg.register(Fixed(v, up))
    text = generate_latest(reg).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_histogram_when_the_frontier_provides_it() -> None:
    counts = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4, 4, 5, 5, 6]
    fams = exposition(view(histogram={"counts": counts, "sum": 42.5}))
    h = fams["idemcrawl_eligibility_delay_seconds"]
    assert h.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in h.samples if s.name.endswith("_bucket")}
    assert buckets["0.005"] == 0 and buckets["1.0"] == 4 and buckets["+Inf"] == 6
    assert len(buckets) == len(ELIGIBILITY_BUCKETS)
    tail = {s.name: s.value for s in h.samples if not s.name.endswith("_bucket")}
    assert tail == {
        "idemcrawl_eligibility_delay_seconds_count": 6,
        "idemcrawl_eligibility_delay_seconds_sum": 42.5,
    }
    with pytest.raises(ValueError, match="returned 3 counts"):
        build_families(view(histogram={"counts": [1, 2, 3], "sum": 0}), None)


def test_missing_counters_read_as_zero_and_empty_ratios_as_nan() -> None:
    fams = exposition(view())
    assert value(fams, "idemcrawl_fetches_total") == 0
    assert value(fams, "idemcrawl_trap_budget_triggers_total") == 0
    assert math.isnan(value(fams, "idemcrawl_requests_per_record"))
    assert math.isnan(value(fams, "idemcrawl_url_duplicate_ratio"))
    assert math.isnan(value(fams, "idemcrawl_robots_cache_age_seconds", stat="max"))
    assert math.isnan(value(fams, "idemcrawl_eligibility_delay_quantile_seconds", quantile="0.5"))
    assert "idemcrawl_parser_backlog" not in fams  # no crawl in this process: not made up


def test_older_and_newer_lease_expiry_counter_names() -> None:
    for counters, want in (
        ({"lease_expiries": 4}, 4),
        ({"leases_expired": 5}, 5),
        ({"lease_expiries": 6, "leases_expired": 6}, 6),
    ):
        st = FrontierStats(counters=counters)
        assert value(exposition(view(stats=st)), "idemcrawl_lease_expiries_total") == want


def test_host_summary() -> None:
    hosts = [
        {"queued": 3, "in_backoff": False, "paused": 0},  # ready
        {"queued": 1, "in_backoff": False, "paused": 0},  # ready (maybe waiting for its gap)
        {"queued": 3, "in_backoff": True, "paused": 0},
        {"queued": 3, "in_backoff": False, "paused": 1},
        {"queued": 0, "in_backoff": False, "paused": 0},  # nothing to do
    ]
    assert host_summary(hosts) == {"ready": 2, "backoff": 1, "paused": 1}


def test_scrapes_are_cached_and_a_missing_database_is_reported_not_raised(
    tmp_path: Path,
) -> None:
    db = tmp_path / "later.db"
    clock = [0.0]
    collector = FrontierCollector(str(db), LiveGauges(parser_backlog=1), clock=lambda: clock[0])
    reg = CollectorRegistry()
    reg.register(collector)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert value(fams, "idemcrawl_frontier_up") == 0
    assert value(fams, "idemcrawl_parser_backlog") == 1  # live gauges still answer
    assert "no crawl database" in (collector.last_error or "")
    open_frontier(str(db)).close()  # the crawl creates its database
    generate_latest(reg)
    assert collector.reads == 0  # within the cache second: not read again
    clock[0] += 1.0
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert value(fams, "idemcrawl_frontier_up") == 1
    for _ in range(5):
        generate_latest(reg)
    assert collector.reads == 1
    collector.close()


def test_busy_port_is_a_clear_error_and_close_frees_the_port(crawl_db: str) -> None:
    server = start_metrics_server(crawl_db, 0)
    try:
        with pytest.raises(OSError, match=r"cannot serve metrics on 127\.0\.0\.1:\d+"):
            start_metrics_server(crawl_db, server.port)
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):
        _OPENER.open(server.url, timeout=2)
    with pytest.raises(ValueError, match="metrics port"):
        start_metrics_server(crawl_db, 70000)


def test_private_registry_leaves_the_global_one_alone(crawl_db: str) -> None:
    from prometheus_client import REGISTRY

    before = generate_latest(REGISTRY)
    reg, collector = make_registry(crawl_db)
    assert "idemcrawl_fetches_total" in generate_latest(reg).decode()
    assert b"idemcrawl_" not in generate_latest(REGISTRY)
    assert generate_latest(REGISTRY).count(b"\n") == before.count(b"\n")
    collector.close()


def test_postgres_frontier_counts_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The numbers are the frontier's: two runs (as if two processes) add up on PostgreSQL."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the crawl's owner slots: none left in /tmp
    from .frontier.conftest import drop_pg_schema, pg_schema_for, require_postgres

    dsn = require_postgres()  # skips locally without a server; fails in CI
    schema = pg_schema_for(tmp_path)
    db = f"{dsn}?schema={schema}"
    try:
        with ShopServer(ShopConfig(listings=2, per_page=5)) as shop:
            warc = str(tmp_path / "warc")
            first = run_crawl(crawl_config(db, shop.seed_url, max_pages=4, warc_dir=warc))
            second = run_crawl(crawl_config(db, shop.seed_url, seeds=(), warc_dir=warc))
        assert second.finished and first.committed > 0 and second.committed > 0
        with start_metrics_server(db, 0) as server:
            _, fams = scrape(server.url)
        assert value(fams, "idemcrawl_frontier_up") == 1
        assert value(fams, "idemcrawl_fetches_total") == first.committed + second.committed
        assert value(fams, "idemcrawl_responses_total", **{"class": "2xx"}) > 0
        assert value(fams, "idemcrawl_records") == 10
        assert value(fams, "idemcrawl_politeness_violations") == 0
    finally:
        drop_pg_schema(schema)
