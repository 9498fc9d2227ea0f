"""Tests for the naive baseline: it must be correct on one run and duplicate on the next.

The duplication is the behaviour under test; if a refactor ever made the second run a
no-op, the baseline would stop demonstrating what it exists to demonstrate.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from idemcrawl.lab.naive import run_naive
from idemcrawl.lab.testsite import ShopConfig, ShopServer, expected_products

from ..helpers import run_cli

CFG = ShopConfig(listings=3, per_page=4)
_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_naive uses plain urlopen, which honours proxy env vars; keep traffic local."""
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def shop() -> Iterator[ShopServer]:
    with ShopServer(CFG) as srv:
        yield srv


def rows(db: Path) -> list[tuple[str, str, str, float]]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            "SELECT sku, price, url, scraped_at FROM products ORDER BY id"
        ).fetchall()


def test_first_run_stores_each_product_once(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "naive.db"
    run_naive(shop.seed_url, str(db))
    got = rows(db)
    expected = expected_products(CFG)
    assert len(got) == len(expected) == 12
    # Visit order: listing by listing, products in page order.
    assert [sku for sku, *_ in got] == list(expected)
    for sku, price, url, scraped_at in got:
        assert price == expected[sku]
        assert url == f"{shop.base_url}/product/{sku}"
        assert scraped_at > 0
    stats = shop.stats()
    # 3 listings + 12 products, each fetched exactly once (the article's 25 + 500 = 525).
    assert stats["total"] == CFG.listings + CFG.products == 15
    assert set(stats["paths"].values()) == {1}


def test_second_run_duplicates_every_row(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "naive.db"
    run_naive(shop.seed_url, str(db))
    run_naive(shop.seed_url, str(db))
    got = rows(db)
    assert len(got) == 2 * CFG.products
    assert Counter(sku for sku, *_ in got) == {sku: 2 for sku in expected_products(CFG)}
    assert shop.stats()["total"] == 2 * (CFG.listings + CFG.products)


def test_runs_as_module_subprocess(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "naive.db"
    proc = run_cli(shop.seed_url, str(db), module="idemcrawl.lab.naive", timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert len(rows(db)) == CFG.products


def test_usage_error_without_arguments() -> None:
    proc = run_cli(module="idemcrawl.lab.naive", timeout=30)
    assert proc.returncode == 2
    assert "usage" in proc.stderr
