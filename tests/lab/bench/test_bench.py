"""Tests for the crawl benchmark: the generated site, both servers, the bare crawler, run_bench.

Everything runs against 127.0.0.1 only; urllib goes through an opener without proxies so an
``http_proxy`` in the environment cannot route test traffic off the machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from selectolax.lexbor import LexborHTMLParser

from idemcrawl import url as urls
from idemcrawl.lab.bench import crawl as bench
from idemcrawl.lab.bench.crawl import BenchOptions, BenchReport, BenchSpider, measure, run_bench
from idemcrawl.lab.bench.site import (
    OUT_OF_SCOPE_URL,
    SiteSpec,
    StaticSite,
    generate_site,
    nginx_path,
    page_html,
    page_links,
    page_url,
)
from idemcrawl.parse import Page, Record

from ...helpers import ROOT, run

BENCHMARKS = ROOT / "benchmarks"
SERVERS = [
    "aiohttp",
    pytest.param(
        "nginx", marks=pytest.mark.skipif(nginx_path() is None, reason="nginx not installed")
    ),
]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with _OPENER.open(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def _resolve(page: str, href: str) -> str:
    return urljoin(page, href).partition("#")[0]


def test_generator_writes_every_page_with_reachable_links(tmp_path: Path) -> None:
    spec = SiteSpec(hosts=3, pages=30, page_kb=6, links=12)
    ports = [9101, 9102, 9103]
    generate_site(spec, ports, tmp_path)
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert len(files) == spec.total_pages + spec.hosts  # pages + one robots.txt per host
    assert (tmp_path / "h0" / "robots.txt").read_text() == "User-agent: *\nAllow: /\n"

    every_page = {page_url(port, n) for port in ports for n in range(spec.pages)}
    forms: set[str] = set()
    cross = 0
    for h, port in enumerate(ports):
        edges: dict[str, list[str]] = {}
        for n in range(spec.pages):
            body = (tmp_path / f"h{h}" / "p" / str(n)).read_bytes()
            assert abs(len(body) - 6 * 1024) < 300, "page size is about page_kb"
            assert body.decode() == page_html(spec, ports, h, n), "deterministic"
            tree = LexborHTMLParser(body)
            assert tree.css_first("span.sku").text() == f"H{h}-P{n}"
            assert tree.css_first("span.price") is not None
            hrefs = [a.attributes["href"] or "" for a in tree.css("a[href]")]
            followable = page_links(spec, ports, h, n)
            assert len(followable) == spec.links
            assert set(followable) <= set(hrefs)
            assert OUT_OF_SCOPE_URL in hrefs and "#top" in hrefs
            here = page_url(port, n)
            targets = [_resolve(here, href) for href in followable]
            assert set(targets) <= every_page, "every followable link is a real page"
            cross += sum(1 for t in targets if urlsplit(t).port != port)
            edges[here] = [t for t in targets if urlsplit(t).port == port]
            for href in followable:
                forms.add(
                    "absolute" if href.startswith("http://")
                    else "protocol-relative" if href.startswith("//")
                    else "root-relative" if href.startswith("/")
                    else "dot" if href.startswith(".")
                    else "relative"
                )  # fmt: skip
        seen, todo = {page_url(port, 0)}, deque([page_url(port, 0)])
        while todo:
            for t in edges[todo.popleft()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        assert len(seen) == spec.pages, f"host {h}: every page reachable from /p/0"
    assert cross == spec.hosts * spec.pages * spec.cross_links
    assert forms == {"absolute", "protocol-relative", "root-relative", "dot", "relative"}


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        SiteSpec(links=0)
    with pytest.raises(ValueError):
        SiteSpec(links=3, cross_links=3)


@pytest.mark.parametrize("server", SERVERS)
def test_server_serves_pages_and_logs_requests(server: str) -> None:
    spec = SiteSpec(hosts=2, pages=5, page_kb=2, links=4)
    with StaticSite(spec, server=server) as site:
        assert site.kind == server
        assert len(site.seeds) == 2 and len(set(site.ports)) == 2
        status, ctype, body = _get(site.seeds[0])
        assert status == 200 and ctype.startswith("text/html")
        assert body.decode() == page_html(spec, site.ports, 0, 0)
        status, ctype, body = _get(site.seeds[1].replace("/p/0", "/robots.txt"))
        assert status == 200 and ctype.startswith("text/plain") and b"Allow: /" in body
        assert _get(site.seeds[0].replace("/p/0", "/missing"))[0] == 404
        _get(site.seeds[0])  # a duplicate
        stats = site.log_stats()
        assert (stats.requests, stats.robots, stats.other) == (4, 1, 1)
        assert (stats.page_requests, stats.unique_pages, stats.duplicates) == (2, 1, 1)
        ports = [e.port for e in site.log_entries()]
        assert ports == [site.ports[0], site.ports[1], site.ports[0], site.ports[0]]
        site.reset_log()
        assert site.log_stats().requests == 0
        _get(site.seeds[1])
        assert site.log_stats().unique_pages == 1
        root = site.root
    assert not root.exists(), "the site directory is removed on exit"


def test_bare_crawler_crawls_tiny_site_completely() -> None:
    spec = SiteSpec(hosts=2, pages=20)
    with StaticSite(spec) as site:
        r = run([sys.executable, str(BENCHMARKS / "bare_crawler.py"), *site.seeds])
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert (out["pages"], out["items"], out["errors"]) == (40, 40, 0)
        stats = site.log_stats()
    assert stats.unique_pages == stats.requests == 40
    assert stats.duplicates == 0 and stats.robots == 0


def test_bench_spider_yields_one_record_and_the_links() -> None:
    spec = SiteSpec(hosts=2, pages=10, page_kb=2, links=6)
    ports = [9201, 9202]
    here = page_url(ports[0], 3)
    page = Page(
        here,
        200,
        {"content-type": "text/html; charset=utf-8"},
        page_html(spec, ports, 0, 3).encode(),
        scope_hosts=frozenset(urls.host_key(page_url(p, 0)) for p in ports),
        scope="host",
    )
    out = list(BenchSpider().parse(page))
    records = [o for o in out if isinstance(o, Record)]
    assert len(records) == 1 and records[0].key == "H0-P3" and records[0].data["price"]
    links = [o for o in out if isinstance(o, str)]
    expected = {_resolve(here, h) for h in page_links(spec, ports, 0, 3)} | {here}  # "#top"
    assert set(links) == expected  # not mailto: nor the out-of-scope partner host


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux-only")
def test_measure_counts_cpu_of_orphaned_descendants(tmp_path: Path) -> None:
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    parent = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {busy!r}])"
    m = measure([sys.executable, "-c", parent], tmp_path, "orphan", timeout=30)
    assert m.exit_code == 0 and not m.timed_out
    assert m.user_s + m.sys_s >= 0.6, "the grandchild's CPU time is counted"
    assert m.wall_s < 0.6, "wall time stops when the tool's main process exits"


def test_options_validation_and_dsn_masking() -> None:
    with pytest.raises(bench.BenchError, match="unknown"):
        BenchOptions(compare=("wget",)).validate()
    with pytest.raises(bench.BenchError, match="--db"):
        BenchOptions(db="/no/such/directory").validate()
    BenchOptions(db="postgresql://u:pw@localhost/bench", runs=2).validate()
    opts = BenchOptions(db="postgresql://u:secret@h/b?schema=mine", compare=("bare",))
    assert "secret" not in opts.command_line() and "u:***@h" in opts.command_line()
    one, two = (bench._db_for(opts, Path("/x"), "r1_idemcrawl") for _ in range(2))
    assert one.startswith("postgresql://u:secret@h/b?schema=bench_crawl_") and one != two
    assert one.endswith("_r1_idemcrawl") and "mine" not in one


def test_crawl_args_reach_the_crawl_and_the_report() -> None:
    opts = BenchOptions(crawl_args=("--parse-workers", "2"), compare=("bare",))
    opts.validate()
    cmd = bench.tool_command("idemcrawl", ["http://127.0.0.1:1/p/0"], opts, "x.db", Path("o"))
    assert cmd[-2:] == ["--parse-workers", "2"]
    assert opts.command_line().endswith("--crawl-args '--parse-workers 2'")
    for reserved in ("--db", "--spider=x", "--json"):
        with pytest.raises(bench.BenchError, match="may not set"):
            BenchOptions(crawl_args=(reserved,)).validate()
    import argparse

    p = argparse.ArgumentParser()
    bench.add_bench_crawl_arguments(p)
    a = p.parse_args(["--crawl-args", "--parse-workers 2 --commit-seconds 0.05"])
    assert bench.options_from_args(a).crawl_args == (
        "--parse-workers", "2", "--commit-seconds", "0.05",
    )  # fmt: skip


def test_missing_scrapy_is_reported_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "scrapy_available", lambda: False)
    tools, skipped = bench.plan_tools(BenchOptions(compare=("scrapy", "bare")))
    assert tools == ["idemcrawl", "bare"]
    assert skipped["scrapy"].startswith("scrapy not installed")
    report = BenchReport(BenchOptions(), "idemcrawl bench crawl", "nginx", {}, skipped=skipped)
    assert "| scrapy | scrapy not installed" in report.text()


@pytest.mark.slow
def test_run_bench_tiny_site() -> None:
    compare = ("bare", "scrapy") if bench.scrapy_available() else ("bare",)
    opts = BenchOptions(
        hosts=2,
        pages=20,
        page_kb=4,
        links=10,
        compare=compare,
        runs=1,
        benchmarks_dir=str(BENCHMARKS),
    )
    lines: list[str] = []
    report = run_bench(opts, log=lines.append)
    assert [r.tool for r in report.runs] == ["idemcrawl", *compare]
    for r in report.runs:
        assert r.ok, (r.tool, r.error)
        assert (r.pages, r.page_requests, r.duplicates, r.items) == (40, 40, 0, 40), r
        assert r.robots == (0 if r.tool == "bare" else 2), r
        assert r.wall_s > 0 and r.cpu_s > 0 and r.peak_rss_mb and r.peak_rss_mb > 5
    idem = report.runs[0]
    assert idem.requests == 42  # 40 pages + one robots.txt per host, nothing else
    if importlib.util.find_spec("psutil") is not None:
        assert idem.rss_source == "tree"
        assert idem.processes >= 2, "parser worker processes are part of the measured tree"
    summary = report.summary("idemcrawl")
    assert summary["complete"] and summary["duplicates"] == 0 and summary["pages"] == 40
    ratios = report.ratios()
    assert set(ratios) == {f"idemcrawl/{c}" for c in compare}
    assert all(v is not None for v in ratios["idemcrawl/bare"].values())
    text = report.text()
    assert text.startswith("Command: `idemcrawl bench crawl --hosts 2 --pages 20")
    assert "| idemcrawl | " in text and "| idemcrawl/bare |" in text
    data = json.loads(json.dumps(report.as_dict()))
    assert data["tools"]["idemcrawl"]["pages"] == 40 and data["expected_pages"] == 40
    assert len(lines) == 1 + len(report.runs)


def test_run_bench_on_postgresql_uses_a_fresh_schema_per_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.frontier.conftest import PG_DSN, require_postgres

    require_postgres()
    import psycopg

    # Only this test's own schemas are checked: other benchmarks or test sessions sharing the
    # server may have theirs open at the same moment.
    used: list[str] = []
    dbs: list[str] = []
    real = bench._with_schema

    def spy(dsn: str, schema: str) -> str:
        used.append(schema)
        dbs.append(real(dsn, schema))
        return dbs[-1]

    monkeypatch.setattr(bench, "_with_schema", spy)
    opts = BenchOptions(hosts=1, pages=10, page_kb=2, links=4, db=PG_DSN, compare=(), runs=2)
    report = run_bench(opts)
    assert [(r.ok, r.pages, r.robots, r.items) for r in report.runs] == [(True, 10, 1, 10)] * 2
    assert len(set(used)) == 2 and all(s.startswith("bench_crawl_") for s in used), used
    # The server is a process of this machine here: its backends' CPU is measured per run.
    assert all(r.server_cpu_s is not None and r.server_cpu_s > 0 for r in report.runs)
    with psycopg.connect(PG_DSN) as con:
        left = con.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (used,)
        ).fetchall()
    assert left == [], "each run's schema is dropped after the run"
    from idemcrawl import owner

    gone = [not os.path.exists(owner.lock_dir_for(db)) for db in dbs]
    assert gone == [True, True], "and its crawl's owner slots in the temp directory"


def test_compare_sqlite_runs_idemcrawl_on_sqlite_beside_a_postgresql_crawl() -> None:
    dsn = "postgresql://u@h/b"
    with pytest.raises(bench.BenchError, match="--db is SQLite already"):
        BenchOptions(compare=("sqlite",)).validate()
    with pytest.raises(bench.BenchError, match="known: scrapy, bare, sqlite"):
        BenchOptions(db=dsn, compare=("sqlite", "wget")).validate()
    opts = BenchOptions(db=dsn, compare=("sqlite", "bare"), benchmarks_dir=str(BENCHMARKS))
    opts.validate()
    assert bench.plan_tools(opts) == (["idemcrawl", "sqlite", "bare"], {})
    assert "--compare sqlite,bare" in opts.command_line()
    sqlite_db = bench._db_for(opts, Path("/scratch"), "r1_sqlite", "sqlite")
    assert sqlite_db == str(Path("/scratch") / "idemcrawl-r1_sqlite.db")
    assert bench._db_for(opts, Path("/scratch"), "r1_idemcrawl").startswith(dsn + "?schema=")
    seeds = ["http://127.0.0.1:1/p/0"]
    cmd = bench.tool_command("sqlite", seeds, opts, sqlite_db, Path("o"))
    assert cmd == bench.tool_command("idemcrawl", seeds, opts, sqlite_db, Path("o"))
    assert cmd[cmd.index("--db") + 1] == sqlite_db
    assert bench._items("sqlite", '{"records": 7}') == 7


@pytest.mark.slow
def test_run_bench_compare_sqlite_reports_the_backends_ratio_per_round() -> None:
    from tests.frontier.conftest import PG_DSN, require_postgres

    require_postgres()
    opts = BenchOptions(
        hosts=1, pages=10, page_kb=2, links=4, db=PG_DSN, compare=("sqlite",), runs=2
    )
    report = run_bench(opts)
    assert [(r.round, r.tool) for r in report.runs] == [
        (1, "idemcrawl"), (1, "sqlite"), (2, "idemcrawl"), (2, "sqlite"),
    ]  # fmt: skip
    assert [(r.ok, r.pages, r.robots, r.items) for r in report.runs] == [(True, 10, 1, 10)] * 4
    # The server's CPU is the PostgreSQL runs' only; the SQLite runs have none to read.
    assert [r.server_cpu_s is not None for r in report.runs] == [True, False, True, False]
    assert all(r.source for r in report.runs), "both are idemcrawl's code"
    mine, theirs = report.tool_runs("idemcrawl"), report.tool_runs("sqlite")
    per_round = sorted(a.pages_per_s / b.pages_per_s for a, b in zip(mine, theirs, strict=True))
    ratio = report.ratios()["idemcrawl/sqlite"]["pages_per_s"]
    assert ratio == pytest.approx(sum(per_round) / 2)
    cpu = report.ratios()["idemcrawl/sqlite"]
    assert cpu["cpu_with_db_s"] is not None and cpu["cpu_s"] is not None
    assert cpu["cpu_with_db_s"] > cpu["cpu_s"], "the server's CPU counts on PostgreSQL's side"
    text = report.text()
    assert "| idemcrawl/sqlite |" in text and "| sqlite |" in text
    assert "idemcrawl/sqlite compares the two backends" in text


@pytest.mark.slow
def test_server_cpu_counts_the_server_s_work_during_the_run_only() -> None:
    """The server's CPU between start and stop, read at those two instants: the work of a
    connection that opens and closes in between (its backend reaped by the postmaster) counts,
    the work an open connection did before the start does not.

    On a server of its own: the idle reading is the whole server's, and on the shared one it
    also counted the statements of tests running beside it (``pytest -n 2``)."""
    import psycopg

    from idemcrawl.lab.bench.dbcost import ServerCpu
    from idemcrawl.lab.pgserver import PgServer, find_bin_dir

    from ...frontier.conftest import in_ci

    if find_bin_dir() is None:
        if in_ci():
            pytest.fail("CI must run this test: no PostgreSQL server binaries", pytrace=False)
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    server = PgServer().start()
    try:
        dsn = server.dsn
        burn = "SELECT count(*) FROM generate_series(1, 3000000)"
        with psycopg.connect(dsn) as before:
            before.execute(burn)  # ~0.2 s of backend CPU, before the start
            idle = ServerCpu(dsn)
            idle.start()
            time.sleep(0.2)
            assert idle.stop() is not None and idle.error is None
            assert idle.seconds is not None and idle.seconds < 0.1, idle.seconds

            during = ServerCpu(dsn)
            during.start()
            with psycopg.connect(dsn) as short_lived:
                short_lived.execute(burn)
            before.execute(burn)  # a backend alive at both ends counts its difference
            time.sleep(0.2)  # let the postmaster reap the closed connection's backend
            seconds = during.stop()
    finally:
        server.stop()
    assert during.error is None
    assert seconds is not None and seconds > 0.2, seconds


def _run(tool: str, rnd: int, **kw: object) -> bench.RunResult:
    base: dict[str, object] = dict(
        tool=tool,
        round=rnd,
        ok=True,
        error=None,
        wall_s=10.0,
        cpu_user_s=8.0,
        cpu_sys_s=1.0,
        peak_rss_mb=100.0,
        rss_source="tree",
        processes=1,
        pages=40,
        page_requests=40,
        robots=2,
        requests=42,
        duplicates=0,
        items=40,
        exit_code=0,
        other_cpu_s=0.5,
    )
    base.update(kw)
    return bench.RunResult(**base)  # type: ignore[arg-type]


def test_report_medians_ratios_and_warnings() -> None:
    opts = BenchOptions(hosts=2, pages=20, compare=("bare",), runs=2)
    report = BenchReport(opts, "idemcrawl bench crawl", "aiohttp", {"CPUs": "2"})
    report.runs = [
        _run("idemcrawl", 1, wall_s=4.0, source="aaa"),
        _run("bare", 1, wall_s=1.0, other_cpu_s=0.1),
        _run("idemcrawl", 2, wall_s=8.0, source="bbb", other_cpu_s=7.0),
        _run("bare", 2, wall_s=1.0, duplicates=3, other_cpu_s=None),
    ]
    assert report.summary("idemcrawl")["pages_per_s"] == pytest.approx((10 + 5) / 2)
    assert report.summary("bare")["duplicates"] == 3
    assert report.ratio("bare", "pages_per_s") == pytest.approx((0.25 + 0.125) / 2)
    text = report.text()
    assert "aaa in round 1, bbb in round 2" in text
    assert "busy during 1 of 3 runs" in text  # one run could not be measured
    assert "| idemcrawl/bare | 0.19x |" in text


def test_ratios_on_a_server_add_the_server_s_cpu_to_idemcrawl_s() -> None:
    opts = BenchOptions(db="postgresql://u@h/b", compare=("sqlite", "bare"), runs=2)
    report = BenchReport(opts, "idemcrawl bench crawl", "nginx", {})
    report.runs = [
        _run("idemcrawl", 1, server_cpu_s=1.0),  # 9 CPU s in the tree, 1 in the server
        _run("sqlite", 1),
        _run("bare", 1, cpu_user_s=2.0),
        _run("idemcrawl", 2, server_cpu_s=3.0),
        _run("sqlite", 2),
        _run("bare", 2, cpu_user_s=2.0),
    ]
    ratios = report.ratios()
    assert ratios["idemcrawl/sqlite"]["cpu_s"] == pytest.approx(1.0)
    assert ratios["idemcrawl/sqlite"]["cpu_with_db_s"] == pytest.approx((10 / 9 + 12 / 9) / 2)
    assert ratios["idemcrawl/bare"]["cpu_with_db_s"] == pytest.approx((10 / 3 + 12 / 3) / 2)
    text = report.text()
    assert "| peak RSS | CPU s with the database server |" in text
    assert "| idemcrawl/sqlite | 1.00x | 1.00x | 1.00x | 1.00x | 1.22x |" in text
    # A server whose CPU could not be read (not this machine's): no figure, not a wrong one.
    report.runs[0].server_cpu_s = report.runs[3].server_cpu_s = None
    assert report.ratios()["idemcrawl/sqlite"]["cpu_with_db_s"] is None
    # On SQLite there is no server: the column is not there.
    local = BenchReport(BenchOptions(compare=("bare",)), "c", "nginx", {})
    local.runs = [_run("idemcrawl", 1), _run("bare", 1)]
    assert "cpu_with_db_s" not in local.ratios()["idemcrawl/bare"]
    assert "with the database server" not in local.text()


def test_pyspy_summary_groups_roles_and_skips_waits(tmp_path: Path) -> None:
    raw = tmp_path / "p.raw"
    raw.write_text(
        'process 1:"python -m idemcrawl crawl";<module> (x.py:1);Engine._process (e.py:3) 6\n'
        'process 1:"python -m idemcrawl crawl";<module> (x.py:1);EpollSelector.select '
        "(selectors.py:9) 4\n"
        'process 1:"python";thread (0x1);Thread._bootstrap (threading.py:1);_worker '
        "(concurrent/futures/thread.py:2);SQLiteFrontier.lease (sqlite.py:7) 3\n"
        'process 2:"python -c from multiprocessing.forkserver import main";_pool_worker '
        "(parse.py:5);simhash64 (dedup.py:8) 5\n"
        "garbage line\n"
    )
    summarize = [sys.executable, str(BENCHMARKS / "pyspy_summary.py")]
    summary = run([*summarize, str(raw), "--top", "3"])
    assert summary.returncode == 0, summary.stderr
    out = summary.stdout
    assert "== crawl: event loop: 10 samples, 6 busy (60%)" in out
    assert "== crawl: SQL thread: 3 samples, 3 busy (100%)" in out
    assert "== parser process: 5 samples, 5 busy (100%)" in out
    assert "100.0%  simhash64 (dedup.py)" in out
    missing = run([*summarize, str(tmp_path / "none.raw")])
    assert missing.returncode == 2 and "cannot read" in missing.stderr
