"""``crawl --render``: pages built by JavaScript, crawled end to end (issue 16 item 5).

A loopback site whose listing and item pages exist only after scripts run; its robots.txt
forbids one API path the page's script also calls. The crawl must find every item when it
renders and none when it does not, the script's requests must obey robots.txt and the host's
delay (the site's own log), and the archive must hold the raw page, its rendered DOM and the
exchanges the script made.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import warcio.archiveiterator
from aiohttp import web

from idemcrawl.engine import run_crawl
from idemcrawl.lab.testsite.server import AppServer
from idemcrawl.parse import Link, Page, Record, Spider
from idemcrawl.warc import RENDERED_PREFIX

from .conftest import crawl_config
from .test_render import browser_or_skip

pytestmark = pytest.mark.browser

PAGE = """<!doctype html><html><head><title>{title}</title></head><body>
<div id="out"></div>
<script>
(async () => {{
  const items = await (await fetch('/api/{what}')).json();
  for (const it of items) {{
    const a = document.createElement('a');
    a.href = it.href; a.className = 'item'; a.textContent = it.name;
    document.getElementById('out').append(a);
  }}
  fetch('/private/track').catch(() => {{}});
}})();
</script></body></html>"""


class JsSite:
    def __init__(self, crawl_delay: float | None = None) -> None:
        self.log: list[tuple[str, float, float]] = []
        self.crawl_delay = crawl_delay

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/robots.txt", self.robots)
        app.router.add_get("/", self.listing)
        app.router.add_get("/item/{n}", self.item)
        app.router.add_get("/api/list", self.api_list)
        app.router.add_get("/api/item/{n}", self.api_item)
        app.router.add_get("/private/track", self.api_list)
        return app

    def _log(self, request: web.Request, started: float) -> None:
        self.log.append((request.path, started, time.monotonic()))

    async def robots(self, request: web.Request) -> web.Response:
        self._log(request, time.monotonic())
        extra = "" if self.crawl_delay is None else f"Crawl-delay: {self.crawl_delay}\n"
        return web.Response(text="User-agent: *\nDisallow: /private/\n" + extra)

    async def listing(self, request: web.Request) -> web.Response:
        self._log(request, time.monotonic())
        return web.Response(text=PAGE.format(title="list", what="list"), content_type="text/html")

    async def item(self, request: web.Request) -> web.Response:
        self._log(request, time.monotonic())
        n = request.match_info["n"]
        html = PAGE.format(title=f"item {n}", what=f"item/{n}")
        return web.Response(text=html, content_type="text/html")

    async def api_list(self, request: web.Request) -> web.Response:
        self._log(request, time.monotonic())
        return web.json_response([{"href": f"/item/{n}", "name": f"item {n}"} for n in range(3)])

    async def api_item(self, request: web.Request) -> web.Response:
        self._log(request, time.monotonic())
        n = request.match_info["n"]
        return web.json_response([{"href": f"/item/{n}#self", "name": f"detail {n}"}])


class RenderedItems(Spider):
    """Items are links with class ``item`` that scripts put in the page; item pages yield one
    record each, keyed by the text their script wrote."""

    def parse(self, page: Page) -> Iterator[Record | Link | str]:
        for a in page.css("a.item[href]"):
            text = a.text()
            if text.startswith("detail "):
                yield Record(key=text, data={"url": page.url})
            else:
                yield Link(str(a.attrs["href"]))


SPIDER = "tests.test_render_crawl:RenderedItems"


@pytest.fixture
def site() -> Iterator[tuple[JsSite, AppServer]]:
    browser_or_skip()
    s = JsSite()
    with AppServer(s.app) as server:
        yield s, server


def crawl(tmp_path: Path, server: AppServer, **kw: Any) -> Any:
    cfg = crawl_config(
        tmp_path / "c.db", f"{server.base_url}/", spider=SPIDER, host_concurrency=1, **kw
    )
    return run_crawl(cfg)


def test_without_render_a_javascript_site_yields_nothing(
    site: tuple[JsSite, AppServer], tmp_path: Path
) -> None:
    _, server = site
    summary = crawl(tmp_path, server)
    assert summary.records == 0


def test_render_finds_every_item_obeys_robots_and_delay_and_archives_the_dom(
    site: tuple[JsSite, AppServer], tmp_path: Path
) -> None:
    log, server = site
    delay = 0.2
    summary = crawl(tmp_path, server, render=True, delay=delay, warc=True)
    assert summary.finished and summary.records == 3
    paths = [p for p, _, _ in log.log]
    assert "/private/track" not in paths  # robots.txt holds for what scripts ask too
    for n in range(3):
        assert paths.count(f"/item/{n}") == 1 and paths.count(f"/api/item/{n}") == 1
    assert paths.count("/") == 1 and paths.count("/api/list") == 1
    # One host, one request at a time, each start a delay after the previous end (I8),
    # whether the crawl or a page's script sent it.
    for (_, _, prev_end), (path, start, _) in zip(log.log, log.log[1:], strict=False):
        assert start >= prev_end, path
        assert start - prev_end >= delay - 0.05, (path, start - prev_end)
    # The archive: each page's raw response and its rendered DOM, and the API exchanges.
    types: dict[str, list[str]] = {}
    for f in sorted((tmp_path / "c.db.warc").glob("*.warc.gz")):
        with open(f, "rb") as fh:
            for r in warcio.archiveiterator.ArchiveIterator(fh):
                uri = r.rec_headers.get_header("WARC-Target-URI") or ""
                types.setdefault(uri, []).append(r.rec_type)
    base = server.base_url
    assert "response" in types[f"{base}/"]
    assert types[f"{RENDERED_PREFIX}{base}/"] == ["conversion"]
    assert "response" in types[f"{base}/api/list"]
    assert all(f"{RENDERED_PREFIX}{base}/item/{n}" in types for n in range(3))


def test_a_robots_crawl_delay_spaces_what_rendering_pages_ask_for(tmp_path: Path) -> None:
    browser_or_skip()
    site = JsSite(crawl_delay=0.3)
    with AppServer(site.app) as server:
        summary = crawl(tmp_path, server, render=True, delay=0.0)
    assert summary.finished and summary.records == 3
    pairs = list(zip(site.log, site.log[1:], strict=False))[1:]  # after robots.txt itself
    assert pairs and all(start - end >= 0.3 - 0.05 for (_, _, end), (_, start, _) in pairs)
