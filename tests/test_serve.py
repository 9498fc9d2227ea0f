"""The dashboard: its JSON API, its safety rules, and the page itself in headless Chromium."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from idemcrawl.engine import CrawlSummary, run_crawl
from idemcrawl.frontier import FrontierError, SQLiteFrontier
from idemcrawl.lab.testsite import ShopConfig, ShopServer
from idemcrawl.lab.testsite.multihost import HostSpec, MultiHostServer
from idemcrawl.serve import PAGE, make_app, read_dashboard, serve
from idemcrawl.status import status_dict

from .conftest import crawl_config
from .frontier.conftest import in_ci
from .helpers import spawn_python


@pytest.fixture(scope="module")
def shop_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = tmp_path_factory.mktemp("serve") / "shop.db"
    with ShopServer(ShopConfig(listings=2, per_page=5)) as shop:
        assert run_crawl(crawl_config(db, shop.seed_url)).finished
    return str(db)


def with_client(db: str, fn: Callable[[TestClient[Any, Any]], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        app = await make_app(db, **kw)
        async with TestServer(app, host="127.0.0.1") as server, TestClient(server) as client:
            await fn(client)

    asyncio.run(main())


def test_api_status_is_status_json_plus_chart_samples(shop_db: str) -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        await asyncio.sleep(0.35)  # a few sampler ticks
        resp = await client.get("/api/status")
        assert resp.status == 200 and resp.headers["Cache-Control"] == "no-store"
        body = await resp.json()
        want = json.loads(json.dumps(status_dict(shop_db)))  # what `status --json` prints
        hosts = want.pop("host_states")
        assert body["status"] == want  # the same numbers as `status --json`
        assert body["host_states_total"] == len(hosts) == 1
        n2xx = counters_of(shop_db)["status_2xx"]
        assert body["status_classes"][0] == ["2xx", n2xx] and n2xx > 0
        assert [c for c, _ in body["status_classes"]] == ["2xx", "3xx", "304", "4xx", "429", "5xx"]
        assert body["slowest_hosts"][0]["host_key"] == hosts[0]["host_key"]
        assert body["backoff_hosts"] == [] and body["paused"] is False
        assert body["traps"]["urls_rejected"] == want["urls"]["rejected"]
        assert len(body["samples"]) >= 2
        assert all(s["fetches_per_s"] == 0 for s in body["samples"])  # finished: flat line

    with_client(shop_db, check, sample_seconds=0.05)


def test_recent_errors_come_from_the_frontier_when_it_can_list_them(
    shop_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"url": "http://127.0.0.1:1/x", "status_code": 500, "last_error": "HTTP 500"}]
    asked: list[int] = []

    def recent_errors(self: SQLiteFrontier, limit: int) -> list[dict[str, Any]]:
        asked.append(limit)
        return rows

    assert read_dashboard(shop_db)["recent_errors"] == []  # a clean crawl has none
    monkeypatch.setattr(SQLiteFrontier, "recent_errors", recent_errors, raising=False)
    assert read_dashboard(shop_db)["recent_errors"] == rows
    assert asked == [10]


def test_loopback_names_only_and_read_only(shop_db: str) -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        # Only the Host *header* names these; every request goes to the loopback test server.
        assert client.host == "127.0.0.1"
        for host in ("evil.example", "evil.example:80", "10.0.0.1"):
            resp = await client.get("/api/status", headers={"Host": host})
            assert resp.status == 403, host  # DNS rebinding cannot read the crawl
        for host in ("localhost:1", "[::1]:8080", "127.0.0.2"):
            assert (await client.get("/", headers={"Host": host})).status == 200, host
        assert (await client.post("/api/status")).status == 405

    with_client(shop_db, check)


def test_page_is_self_contained_with_a_strict_policy(shop_db: str) -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        resp = await client.get("/")
        assert resp.status == 200 and resp.content_type == "text/html"
        csp = resp.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp
        assert "unsafe-inline" not in csp and "sha256-" in csp
        assert await resp.text() == PAGE

    with_client(shop_db, check)
    # Nothing fetched from anywhere: the only absolute URL is the SVG namespace name.
    assert set(re.findall(r"\w+://[^\s\"']*", PAGE)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", PAGE)
    assert ".innerHTML" not in PAGE  # crawled text only ever goes in as textContent


def test_database_errors_are_clear(
    tmp_path: Path, shop_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FrontierError, match="no crawl database"):
        asyncio.run(make_app(str(tmp_path / "missing.db")))
    listened: list[str] = []

    async def no_listen(db: str, port: int, host: str, ready: Any) -> None:
        listened.append(host)  # would open a socket on a non-loopback address

    monkeypatch.setattr("idemcrawl.serve._serve", no_listen)
    for host in ("0.0.0.0", "192.168.1.10", "example.com"):
        with pytest.raises(ValueError, match="loopback only"):
            serve(shop_db, 0, host)
    assert listened == []  # refused before any socket exists
    monkeypatch.undo()

    gone = tmp_path / "gone.db"
    shutil.copy(shop_db, gone)

    async def check(client: TestClient[Any, Any]) -> None:
        gone.unlink()
        gone.mkdir()  # now unreadable as a database
        await asyncio.sleep(1.1)  # past the read cache
        resp = await client.get("/api/status")
        assert resp.status == 503
        assert "cannot read" in (await resp.json())["error"]

    with_client(str(gone), check)


# -- the page in a real browser -----------------------------------------------------------------


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if in_ci():  # CI=true: the browser test must run, never skip
        pytest.fail("chromium is required in CI (Debian package 'chromium')")
    pytest.skip("chromium is not installed")


class DataK(HTMLParser):
    """Text and data-v of every element carrying data-k (the page's numbers)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, tuple[str, str]] = {}
        self.ids: dict[str, str] = {}
        self._open: list[tuple[str | None, str | None, str, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self._open.append((a.get("data-k"), a.get("id"), a.get("data-v") or "", []))

    def handle_data(self, data: str) -> None:
        for entry in self._open:
            entry[3].append(data)

    def handle_endtag(self, tag: str) -> None:
        if not self._open:
            return
        key, ident, v, text = self._open.pop()
        if key:
            self.found[key] = ("".join(text).strip(), v)
        if ident:
            self.ids[ident] = "".join(text).strip()


def dump(browser: str, url: str, profile: Path, screenshot: Path | None = None) -> DataK:
    """Load the page in headless Chromium that can reach loopback and nothing else."""
    cmd = [
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        # Belt and braces: any non-loopback request goes to a dead local proxy, and every name
        # but 127.0.0.1 fails to resolve, so the browser cannot send a packet off the machine.
        "--proxy-server=http://127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--virtual-time-budget=5000",
        "--dump-dom",
    ]
    if screenshot is not None:
        cmd += [f"--screenshot={screenshot}", "--window-size=1280,900"]
    env = {**os.environ, "HOME": str(profile), "XDG_CONFIG_HOME": str(profile)}
    env["XDG_CACHE_HOME"] = str(profile)
    out = subprocess.run(
        [*cmd, url], capture_output=True, text=True, timeout=60, env=env, cwd=profile
    )
    assert out.returncode == 0, out.stderr[-2000:]
    parser = DataK()
    parser.feed(out.stdout)
    assert parser.found, out.stdout[:2000]
    return parser


def expected(key: str, status: dict[str, Any], counters: dict[str, int]) -> Any:
    head, _, rest = key.partition(".")
    if head == "status_classes":
        return counters.get(f"status_{rest}", 0)
    if head == "counters":
        return counters.get(rest, 0)
    v: Any = status
    for part in key.split("."):
        v = v[part]
    return v


def counters_of(db: str) -> dict[str, int]:
    from idemcrawl.frontier import open_frontier

    f = open_frontier(db, create=False)
    try:
        return dict(f.stats().counters)
    finally:
        f.close()


MONOTONE = ("urls_total", "urls.done", "records", "requests", "politeness.grants")


@pytest.fixture
def dashboard_proc(tmp_path: Path) -> Iterator[Callable[[str], tuple[str, subprocess.Popen[str]]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(db: str) -> tuple[str, subprocess.Popen[str]]:
        code = "import sys; from idemcrawl.serve import serve; serve(sys.argv[1], 0)"
        p = spawn_python(code, db, cwd=tmp_path, stdout=None)
        procs.append(p)
        assert p.stderr is not None
        line = p.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert m, line
        return m.group(0), p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.browser
def test_dashboard_in_headless_chromium_matches_status(
    tmp_path: Path, dashboard_proc: Callable[[str], tuple[str, subprocess.Popen[str]]]
) -> None:
    browser = chromium()
    db = str(tmp_path / "crawl.db")
    specs = [
        HostSpec("a", pages=16, latency_ms=40, status_pages=True),  # 429, 503, 500 too
        HostSpec("b", pages=16, latency_ms=40),
        HostSpec("c", pages=16, latency_ms=40),
    ]
    with MultiHostServer(specs) as site:
        result: list[CrawlSummary] = []
        cfg = crawl_config(
            db,
            site.seed_urls[0],
            seeds=tuple(site.seed_urls),
            spider="idemcrawl.lab.testsite.page_spider:PageSpider",
            host_concurrency=1,
            delay=0.25,  # ~5 s per host: the page is opened while the crawl runs
            retry_base=0.2,
            backoff_base=0.2,
            max_retries=2,
        )
        crawler = threading.Thread(target=lambda: result.append(run_crawl(cfg)), daemon=True)
        crawler.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if status_dict(db)["urls"]["done"] > 0:
                    break
            except FrontierError:
                pass
            time.sleep(0.1)
        # Read before the dashboard starts: its first read (cached for a second) is no older
        # than this, so every counter it shows is at least this one's.
        before = status_dict(db)
        url, proc = dashboard_proc(db)
        profile = tmp_path / "profile"
        profile.mkdir()

        assert before["urls"]["queued"] + before["urls"]["leased"] > 0, "crawl ended too soon"
        mid = dump(browser, url, profile)
        after = status_dict(db)
        for key in MONOTONE:
            got = int(mid.found[key][0].replace(",", ""))
            assert expected(key, before, {}) <= got <= expected(key, after, {}), key
        assert mid.ids["state"] in ("running", "finished")

        crawler.join(timeout=60)
        assert result and result[0].finished
    time.sleep(1.2)  # past the dashboard's 1 s read cache: what it serves now is final
    shot = tmp_path / "dashboard.png"
    final = dump(browser, url, profile, screenshot=shot)
    status, counters = status_dict(db), counters_of(db)
    assert status["politeness"]["violations"] == 0
    assert status["records"] == 3 * 16 and counters.get("status_2xx", 0) > 0
    assert len(final.found) >= 20
    for key, (text, v) in final.found.items():
        if key == "hosts_in_backoff":  # depends on the clock, not only on the crawl
            assert 0 <= int(text) <= status["hosts"]
            continue
        want = expected(key, status, counters)
        if want is None:
            assert v == "" and text == "-", key
            continue
        assert float(v) == pytest.approx(float(want), abs=1e-9), key
        if isinstance(want, int) and key != "counters.bytes_fetched":  # bytes shown as KiB
            assert text.replace(",", "") == str(want), (key, text)
    assert final.ids["state"] == "finished"
    peak = re.search(r"fetches/s: now [\d.]+, peak ([\d.]+)", final.ids["chart-f"])
    assert peak and float(peak.group(1)) > 0, final.ids["chart-f"]  # the crawl is on the chart

    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1280, 900)
    keep = os.environ.get("IDEMCRAWL_SCREENSHOT")  # e.g. docs/dashboard.png
    if keep:
        shutil.copy(shot, keep)

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0  # stops cleanly on SIGTERM
