"""Sitemaps end to end: robots.txt Sitemap lines, an index with a gzip child, --sitemap."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from idemcrawl.engine import run_crawl
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.lab.testsite.server import AppServer

from .conftest import crawl_config


class SitemapSite:
    """A host whose pages are reachable only through its sitemaps."""

    def __init__(self, robots_lists_sitemap: bool) -> None:
        self.robots_lists_sitemap = robots_lists_sitemap
        self.seen: list[str] = []
        self.base = ""

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.StreamResponse:
            path = request.path_qs
            self.seen.append(path)
            b = self.base
            if path == "/robots.txt":
                text = "User-agent: *\nDisallow: /private\n"
                if self.robots_lists_sitemap:
                    text += (
                        f"Sitemap: {b}/sitemap_index.xml\nSitemap: http://elsewhere.test/s.xml\n"
                    )
                return web.Response(text=text)
            if path == "/sitemap_index.xml":
                return web.Response(
                    text="<?xml version='1.0'?><sitemapindex xmlns='http://www.sitemaps.org/"
                    f"schemas/sitemap/0.9'><sitemap><loc>{b}/sm1.xml.gz</loc></sitemap>"
                    f"<sitemap><loc>{b}/sm2.xml</loc></sitemap></sitemapindex>",
                    content_type="application/xml",
                )
            if path == "/sm1.xml.gz":
                xml = (
                    "<?xml version='1.0'?><urlset xmlns='http://www.sitemaps.org/schemas/"
                    f"sitemap/0.9'><url><loc>{b}/a</loc><priority>0.9</priority></url>"
                    f"<url><loc>{b}/b</loc><lastmod>2026-11-01</lastmod></url>"
                    f"<url><loc>{b}/private/x</loc></url></urlset>"
                )
                return web.Response(
                    body=gzip.compress(xml.encode()), content_type="application/gzip"
                )
            if path == "/sm2.xml":
                return web.Response(
                    text="<?xml version='1.0'?><urlset xmlns='http://www.sitemaps.org/schemas/"
                    f"sitemap/0.9'><url><loc>{b}/c</loc></url>"
                    "<url><loc>http://other.test/d</loc></url></urlset>",
                    content_type="application/xml",
                )
            if path in ("/", "/a", "/b", "/c"):
                return web.Response(
                    text="<html><p>no links here</p></html>", content_type="text/html"
                )
            return web.Response(status=404)

        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handle)
        return app


@pytest.fixture(params=[True, False], ids=["robots-sitemap", "flag-sitemap"])
def site(request: pytest.FixtureRequest) -> Iterator[SitemapSite]:
    s = SitemapSite(robots_lists_sitemap=request.param)
    with AppServer(s.app) as server:
        s.base = server.base_url
        yield s


def test_sitemap_urls_are_crawled(site: SitemapSite, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    extra = {} if site.robots_lists_sitemap else {"sitemaps": (f"{site.base}/sitemap_index.xml",)}
    summary = run_crawl(crawl_config(db, f"{site.base}/", spider=None, **extra))
    assert summary.finished
    fetched = set(site.seen)
    assert {"/a", "/b", "/c", "/sm1.xml.gz", "/sm2.xml", "/sitemap_index.xml"} <= fetched
    assert "/private/x" not in fetched  # robots.txt still applies to sitemap entries
    assert max(site.seen.count(p) for p in fetched) == 1
    f = SQLiteFrontier(str(db))
    a = f.url_row(f"{site.base}/a")
    c = f.url_row(f"{site.base}/c")
    events = f.stats().events
    f.close()
    assert a is not None and c is not None and a["priority"] > c["priority"]  # priority 0.9
    assert events == 4  # /, /a, /b, /c: sitemaps themselves emit no index event
