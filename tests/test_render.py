"""Rendering JavaScript pages in headless Chromium (``idemcrawl.render``, issue 16 item 5).

A real browser against a real loopback site: the page's document is the response fetched
beforehand, everything the page asks for goes through the crawl's ``Fetcher`` (SSRF guard and
all), the site's own request log shows what reached it and when.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from idemcrawl.fetch import Fetcher, FetchResult, FetchSettings, parse_allow_list
from idemcrawl.lab.testsite.server import AppServer
from idemcrawl.render import Renderer, RenderError, RenderSettings, find_browser

from .frontier.conftest import in_ci

pytestmark = pytest.mark.browser

ITEMS_PAGE = """<!doctype html><html><head><title>items</title>
<script src="/app.js"></script></head><body><ul id="items"></ul></body></html>"""
APP_JS = """
document.addEventListener('DOMContentLoaded', async () => {
  for (const n of [1, 2, 3]) {
    const r = await fetch('/api/items?page=' + n);
    for (const item of await r.json()) {
      const li = document.createElement('li');
      li.className = 'item'; li.textContent = item;
      document.getElementById('items').append(li);
    }
  }
});
"""


class Site:
    """A small JS site that logs (path, start, end, user agent) of every request it serves."""

    def __init__(self) -> None:
        self.log: list[tuple[str, float, float, str]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/items", self.page(ITEMS_PAGE))
        app.router.add_get("/app.js", self.script)
        app.router.add_get("/api/items", self.api)
        app.router.add_get("/pic.png", self.page("png"))
        return app

    def _logged(self, request: web.Request, started: float) -> None:
        self.log.append(
            (request.path_qs, started, time.monotonic(), request.headers.get("User-Agent", ""))
        )

    def page(self, body: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            self._logged(request, time.monotonic())
            return web.Response(text=body, content_type="text/html")

        return handler

    async def script(self, request: web.Request) -> web.Response:
        self._logged(request, time.monotonic())
        return web.Response(text=APP_JS, content_type="application/javascript")

    async def api(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        await asyncio.sleep(0.02)
        self._logged(request, started)
        n = int(request.query["page"])
        return web.json_response([f"item {n}-{i}" for i in range(2)])


def browser_or_skip() -> None:
    if find_browser() is None:
        if in_ci():
            pytest.fail("a Chromium is required in CI (Debian package 'chromium')")
        pytest.skip("no Chromium installed")
    pytest.importorskip("playwright") if not in_ci() else __import__("playwright")


@pytest.fixture
def site() -> Iterator[tuple[Site, AppServer]]:
    browser_or_skip()
    s = Site()
    with AppServer(s.app) as server:
        yield s, server


def document(url: str, html: str) -> FetchResult:
    """The page's response as the crawl fetched it (the render starts from it)."""
    return FetchResult(url, 200, {"content-type": "text/html"}, html.encode(), 0.01)


async def render_with_fetcher(
    page: FetchResult, settings: RenderSettings, *, gap: float = 0.0, allow: str = "127.0.0.1"
) -> Any:
    fs = FetchSettings(allow_private=parse_allow_list([allow]), user_agent="render-test/1")
    async with Fetcher(fs, 4) as fetcher:

        async def sub(url: str, method: str, headers: dict[str, str], body: bytes | None) -> Any:
            assert method == "GET" and body is None
            return await fetcher.fetch(url, headers)

        async with Renderer(settings) as renderer:
            return await renderer.render(page, sub, gap=gap)


def test_a_page_built_by_scripts_is_rendered_through_the_crawls_fetcher(
    site: tuple[Site, AppServer],
) -> None:
    log, server = site
    url = f"{server.base_url}/items"
    result = asyncio.run(
        render_with_fetcher(document(url, ITEMS_PAGE), RenderSettings(user_agent="render-test/1"))
    )
    assert result.cut_reason is None
    for n in (1, 2, 3):
        assert f"item {n}-0" in result.html and f"item {n}-1" in result.html
    # The document was not fetched again; the script and the three API calls were, by our
    # fetcher (its User-Agent), and each is recorded for the archive.
    paths = [p for p, *_ in log.log]
    assert "/items" not in paths
    assert paths == ["/app.js", "/api/items?page=1", "/api/items?page=2", "/api/items?page=3"]
    assert {ua for *_, ua in log.log} == {"render-test/1"}
    assert [x.url.rsplit("/", 1)[1] for x in result.fetched] == [
        "app.js", "items?page=1", "items?page=2", "items?page=3",
    ]  # fmt: skip


def test_requests_on_the_host_are_one_at_a_time_a_gap_apart(
    site: tuple[Site, AppServer],
) -> None:
    log, server = site
    url = f"{server.base_url}/items"
    started = time.monotonic()
    result = asyncio.run(render_with_fetcher(document(url, ITEMS_PAGE), RenderSettings(), gap=0.3))
    assert result.cut_reason is None and "item 3-1" in result.html
    starts = [s for _, s, _, _ in log.log]
    ends = [e for _, _, e, _ in log.log]
    assert starts[0] - started >= 0.3  # a gap after the document itself
    for prev_end, start in zip(ends, starts[1:], strict=False):
        assert start - prev_end >= 0.3 - 0.02  # the server's clock sees the request a bit later


def test_other_hosts_images_and_navigation_are_refused_without_a_connection(
    site: tuple[Site, AppServer],
) -> None:
    log, server = site
    other = server.base_url.replace("127.0.0.1", "127.0.0.2")
    html = f"""<html><body><img src="/pic.png"><p id=x>static</p>
    <script>
      fetch('{other}/api/items?page=9').catch(() => {{}});
      setTimeout(() => {{ location.href = '/elsewhere'; }}, 50);
    </script></body></html>"""
    url = f"{server.base_url}/page"
    result = asyncio.run(render_with_fetcher(document(url, html), RenderSettings(timeout=5)))
    assert log.log == []  # nothing reached the site: image skipped, navigation refused
    errors = {x.url: x.error for x in result.exchanges}
    assert errors[f"{other}/api/items?page=9"].startswith("refused: other host")
    assert any(u.endswith("/elsewhere") and e and "navigated away" in e for u, e in errors.items())
    assert "static" in result.html


def test_third_party_requests_still_pass_the_ssrf_guard(site: tuple[Site, AppServer]) -> None:
    log, server = site
    other = server.base_url.replace("127.0.0.1", "127.0.0.2")
    html = f"<html><body><script>fetch('{other}/api/items?page=1')</script></body></html>"
    url = f"{server.base_url}/page"
    settings = RenderSettings(third_party=True, timeout=5)
    result = asyncio.run(render_with_fetcher(document(url, html), settings))
    (x,) = result.exchanges
    assert x.result is None and x.error is not None and "blocked" in x.error.lower()
    assert log.log == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("while (true) {}", "render timeout"),
        (
            "const b = document.body; for (let i = 0; ; i++) { const d = "
            "document.createElement('div'); d.textContent = 'x'.repeat(200) + i; b.append(d); }",
            "renderer crashed",
        ),
        ("const a = []; while (true) { a.push(new Array(1e6).fill(1.5)); }", "renderer crashed"),
    ],
    ids=["endless-script", "endless-dom", "endless-heap"],
)
def test_a_hostile_page_is_cut_with_a_reason_and_the_browser_lives_on(
    site: tuple[Site, AppServer], script: str, reason: str
) -> None:
    _, server = site
    hostile_html = f"<html><body><script>{script}</script></body></html>"
    hostile = document(f"{server.base_url}/h", hostile_html)
    fine = document(f"{server.base_url}/items", ITEMS_PAGE)
    settings = RenderSettings(timeout=4, memory_mb=384, heap_mb=64)

    async def both() -> tuple[Any, Any, float]:
        fs = FetchSettings(allow_private=parse_allow_list(["127.0.0.1"]))
        async with Fetcher(fs, 4) as fetcher, Renderer(settings) as renderer:

            async def sub(url: str, method: str, headers: dict[str, str], body: Any) -> Any:
                return await fetcher.fetch(url, headers)

            t0 = time.monotonic()
            cut = await renderer.render(hostile, sub)
            took = time.monotonic() - t0
            after = await renderer.render(fine, sub)
            return cut, after, took

    cut, after, took = asyncio.run(both())
    assert cut.cut_reason is not None and cut.cut_reason.startswith(reason), cut.cut_reason
    assert took < settings.timeout + 8
    assert after.cut_reason is None and "item 3-1" in after.html


def test_the_pool_bounds_pages_rendered_at_once(site: tuple[Site, AppServer]) -> None:
    _, server = site
    pages = [document(f"{server.base_url}/p{i}", "<html><body>x</body></html>") for i in range(4)]
    live = 0
    peak = 0

    async def go() -> None:
        nonlocal live, peak
        async with Renderer(RenderSettings(contexts=2)) as renderer:
            original = renderer._live_browser

            async def counting() -> Any:
                nonlocal live, peak
                live += 1
                peak = max(peak, live)
                await asyncio.sleep(0.05)
                live -= 1
                return await original()

            renderer._live_browser = counting  # type: ignore[method-assign]

            async def no_fetch(*_: Any) -> Any:
                raise AssertionError("nothing to fetch")

            await asyncio.gather(*(renderer.render(p, no_fetch) for p in pages))
            assert renderer.renders == 4

    asyncio.run(go())
    assert peak == 2


def test_a_missing_browser_is_a_clear_error() -> None:
    pytest.importorskip("playwright")

    async def go() -> None:
        async with Renderer(RenderSettings(executable="/nonexistent/chromium")):
            pass

    with pytest.raises(RenderError, match="no Chromium found"):
        asyncio.run(go())


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="contexts"):
        RenderSettings(contexts=0)
    with pytest.raises(ValueError, match="memory"):
        RenderSettings(memory_mb=10)


def test_a_renderer_not_entered_starts_on_its_first_render(site: tuple[Site, AppServer]) -> None:
    _, server = site
    page = document(
        f"{server.base_url}/p",
        "<html><body><script>document.body.append('js')</script></body></html>",
    )

    async def go() -> Any:
        renderer = Renderer(RenderSettings())
        try:
            return await renderer.render(page, render_nothing)
        finally:
            await renderer.close()

    assert "js" in asyncio.run(go()).html


async def render_nothing(*_: Any) -> Any:
    raise AssertionError("nothing to fetch")


def test_a_browser_that_cannot_start_fails_each_render_the_same_way() -> None:
    pytest.importorskip("playwright")
    page = document("http://127.0.0.1:9/p", "<html></html>")

    async def go() -> list[str]:
        renderer = Renderer(RenderSettings(executable="/nonexistent/chromium"))
        errors = []
        for _ in range(2):
            with pytest.raises(RenderError) as exc:
                await renderer.render(page, render_nothing)
            errors.append(str(exc.value))
        await renderer.close()
        return errors

    first, second = asyncio.run(go())
    assert first == second and "no Chromium found" in first
