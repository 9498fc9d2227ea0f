"""R19: a spider bug costs a re-parse from the WARC store, not a re-crawl."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from idemcrawl import Record, Spider
from idemcrawl.engine import run_crawl
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.lab.testsite import ShopServer
from idemcrawl.lab.testsite.shop import expected_products
from idemcrawl.lab.testsite.shop_spider import ShopSpider
from idemcrawl.reparse import reparse

from .conftest import crawl_config
from .helpers import run_cli


class BuggySpider(ShopSpider):
    """The shop spider with a bug: it crashes on every product page."""

    def parse(self, page):  # type: ignore[no-untyped-def]
        if page.css_first(".sku") is not None:
            raise KeyError("price")
        yield from super().parse(page)


class FixedSpider(ShopSpider):
    pass


class PricesInCents(Spider):
    """A changed spider: a new field shape for the same records."""

    name = "shop"

    def parse(self, page) -> Iterator[Record]:  # type: ignore[no-untyped-def]
        sku = page.css_first(".sku")
        if sku is not None:
            price = page.css_first(".price").text()
            yield Record(key=sku.text(), data={"sku": sku.text(), "cents": price.replace(".", "")})


def test_reparse_failed_pages_from_the_store_without_requests(
    shop: ShopServer, tmp_path: Path
) -> None:
    db = tmp_path / "c.db"
    summary = run_crawl(crawl_config(db, shop.seed_url, spider="tests.test_reparse:BuggySpider"))
    assert summary.finished
    products = len(expected_products(shop.cfg))
    f = SQLiteFrontier(str(db))
    assert f.stats().records == 0
    assert f.stats().urls_by_state["failed"] == products
    f.close()
    requests_before = shop.stats()["total"]

    s = reparse(str(db), spider="tests.test_reparse:FixedSpider", where_failed=True)
    assert (s.pages, s.failed, s.missing) == (products, 0, 0)
    assert shop.stats()["total"] == requests_before  # not one request to the site
    f = SQLiteFrontier(str(db))
    records = {r["key"]: json.loads(r["data"])["price"] for r in f.records()}
    assert records == expected_products(shop.cfg)
    assert f.stats().urls_by_state["failed"] == 0
    f.close()

    # A changed spider rebuilds every record in place (same ids), still without the network.
    s = reparse(str(db), spider="tests.test_reparse:PricesInCents")
    assert s.pages >= products and s.missing == 0
    assert shop.stats()["total"] == requests_before
    f = SQLiteFrontier(str(db))
    rows = list(f.records())
    f.close()
    assert len(rows) == products
    assert all("cents" in json.loads(r["data"]) for r in rows)


def test_reparse_cli_reports_zero_requests(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    run_crawl(crawl_config(db, shop.seed_url, spider="tests.test_reparse:BuggySpider"))
    res = run_cli(
        "reparse",
        "--db",
        str(db),
        "--spider",
        "tests.test_reparse:FixedSpider",
        "--where-failed",
        "--json",
        "--quiet",
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["requests"] == 0 and out["records"] == len(expected_products(shop.cfg))
    missing = run_cli("reparse", "--db", str(db), "--warc-dir", "/nope")
    assert missing.returncode == 2 and "no WARC store" in missing.stderr


def test_an_archive_failure_stops_the_crawl_cleanly_and_loses_nothing(
    shop: ShopServer, tmp_path: Path, monkeypatch: object
) -> None:
    import pytest

    from idemcrawl.warc import WarcError, WarcStore

    db = tmp_path / "c.db"
    real = WarcStore._append_locked
    calls = {"n": 0}

    # Every write goes through the append (exchanges built by the parser process and those the
    # store builds itself alike): the disk fills up after the fifth.
    def failing(self: WarcStore, blob: bytes) -> tuple[str, int]:
        calls["n"] += 1
        if calls["n"] > 5:
            raise WarcError("No space left on device")
        return real(self, blob)

    mp = pytest.MonkeyPatch()
    mp.setattr(WarcStore, "_append_locked", failing)
    try:
        summary = run_crawl(crawl_config(db, shop.seed_url))
    finally:
        mp.undo()
    assert not summary.finished and summary.stopped_by == "archive-error"
    assert "No space left" in (summary.fatal or "")
    # Nothing committed without its archive; the rerun resumes and completes everything.
    again = run_crawl(crawl_config(db, shop.seed_url))
    assert again.finished
    f = SQLiteFrontier(str(db))
    records = {r["key"]: json.loads(r["data"])["price"] for r in f.records()}
    f.close()
    import sqlite3

    con = sqlite3.connect(db)
    (unarchived,) = con.execute(
        "SELECT count(*) FROM urls WHERE kind = 'page' AND state = 'done' AND warc_file IS NULL"
    ).fetchone()
    con.close()
    assert records == expected_products(shop.cfg)
    assert unarchived == 0
