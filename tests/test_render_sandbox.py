"""The sandbox's JavaScript page through ``Request(render=True)`` (``examples/js.py``).

The page's list is empty in its HTML; its script fills it from the JSON API. Rendered, the
example yields the API's items; the same request without rendering yields nothing. The
script's API call reaches the server through the crawl (after the page, a delay later), and
the request's ``render`` flag is kept in the frontier like its callback.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemcrawl.lab.testsite.sandbox import SandboxConfig, SandboxServer, expected_js
from idemcrawl.parse import Page, Record, Request, Spider

from .helpers import run
from .test_render import browser_or_skip
from .test_sandbox_crawl import records

pytestmark = pytest.mark.browser


class NotRendered(Spider):
    """``examples/js.py`` without ``render``: the callback sees the HTML as served."""

    name = "js"

    def start_requests(self) -> Iterator[Request]:
        yield Request(f"{os.environ['SANDBOX']}/js?page=1", self.parse_list, data={"page": 1})

    def parse_list(self, page: Page) -> Iterator[Record]:
        for li in page.css("li.item"):
            yield Record(f"js-{li.attrs['data-id']}", {"title": li.text(), **page.data})


def crawl(db: Path, spider: str, base: str, delay: str = "0") -> list[str]:
    return [
        sys.executable, "-m", "idemcrawl", "crawl", "--db", str(db), "--spider", spider,
        "--delay", delay, "--latency-factor", "0", "--allow-private", "127.0.0.1", "--quiet",
    ]  # fmt: skip


def test_the_javascript_example_yields_items_only_when_rendered(tmp_path: Path) -> None:
    browser_or_skip()
    cfg = SandboxConfig()
    with SandboxServer(cfg) as server:
        env = {"SANDBOX": server.base_url}
        done = run(crawl(tmp_path / "r.db", "examples/js.py:Rendered", server.base_url, "0.3"),
                   env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        log = [e for e in server.requests() if e["path"] != "/robots.txt"]
        plain = run(crawl(tmp_path / "p.db", "tests.test_render_sandbox:NotRendered",
                          server.base_url), env=env)  # fmt: skip
        assert plain.returncode == 0, plain.stderr
    assert records(tmp_path / "r.db") == expected_js(cfg)
    assert records(tmp_path / "p.db") == {}
    # Each page, then its script's API call: sent by the crawl, one at a time, a delay apart;
    # the next page only once the script made the link to it.
    pages = -(-cfg.api_items // cfg.api_page)
    assert [(e["method"], e["path"]) for e in log] == [
        ("GET", path)
        for n in range(1, pages + 1)
        for path in (f"/js?page={n}", f"/api/items?offset={(n - 1) * cfg.api_page}")
    ]
    assert all(b["t"] - a["t"] >= 0.3 - 0.05 for a, b in itertools.pairwise(log))
    con = sqlite3.connect(tmp_path / "r.db")
    try:
        (row,) = con.execute(
            "SELECT r.callback, r.render FROM requests r JOIN urls u USING (url_id) "
            "WHERE u.url LIKE '%/js?page=2'"
        ).fetchall()
    finally:
        con.close()
    assert row == ("parse_list", 1)  # the followed page is rendered too
