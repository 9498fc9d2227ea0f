"""Crawls of the scraping sandbox (``testsite --site sandbox``) by the example spiders, in
crawl processes, some of them killed with SIGKILL (issue 16)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from idemcrawl.lab.testsite.sandbox import (
    CATEGORIES,
    SandboxConfig,
    SandboxServer,
    expected_api,
    expected_items,
    expected_search,
    item_category,
)

from .helpers import DEVNULL, run, spawn


def crawl_cmd(db: Path, spider: str, *seeds: str, concurrency: int = 4) -> list[str]:
    return [
        sys.executable, "-m", "idemcrawl", "crawl", *seeds, "--db", str(db), "--spider", spider,
        "--concurrency", str(concurrency), "--host-concurrency", str(concurrency),
        "--delay", "0", "--latency-factor", "0", "--allow-private", "127.0.0.1", "--quiet",
    ]  # fmt: skip


def records(db: Path) -> dict[str, Any]:
    con = sqlite3.connect(db)
    try:
        return {k: json.loads(d) for k, d in con.execute("SELECT key, data FROM records")}
    finally:
        con.close()


def test_catalog_spider_carries_listing_context_to_details(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with SandboxServer() as server:
        base = server.base_url
        done = run(crawl_cmd(db, "examples/catalog.py:Catalog", f"{base}/catalog"))
        assert done.returncode == 0, done.stderr
        log = server.requests()
    assert records(db) == expected_items(server.cfg)
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT u.url, r.callback FROM requests r JOIN urls u USING (url_id)"
        ).fetchall()
    finally:
        con.close()
    # Only the detail pages have a side-table row: the listings are plain GETs for parse.
    assert sorted(rows) == sorted((f"{base}/item/{i}", "parse_item") for i in range(1, 21))
    assert all(e["method"] == "GET" for e in log)


def _kill_after(server: SandboxServer, cmd: list[str], n: int) -> None:
    before = len(server.requests())
    proc = spawn(cmd, new_session=True, stdout=DEVNULL, stderr=DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if len(server.requests()) >= before + n:
            break
        time.sleep(0.002)
    assert proc.poll() is None, "crawl ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_callback_context_and_method_survive_sigkill(tmp_path: Path) -> None:
    """10 SIGKILLs, then a run to the end: exactly the expected records, and every request the
    server saw was made the way the spider asked (POST with its body for searches, GET for
    the rest), whichever process made it."""
    cfg = SandboxConfig(pages=6, per_page=5, latency_ms=25)
    db = tmp_path / "k.db"
    spider = "tests.sandbox_spiders:CatalogSearch"
    with SandboxServer(cfg) as server:
        seed = f"{server.base_url}/catalog?page=1"
        for i in range(10):
            _kill_after(server, crawl_cmd(db, spider, seed, concurrency=3), 3 + i % 3)
        done = run(crawl_cmd(db, spider, seed), timeout=120)
        assert done.returncode == 0, done.stderr
        log = server.requests()
    queries = sorted({item_category(i) for i in range(1, cfg.pages * cfg.per_page + 1)})
    assert set(queries) <= set(CATEGORIES)
    assert records(db) == {**expected_items(cfg), **expected_search(cfg, queries)}
    searches = [e for e in log if e["path"] == "/search"]
    assert searches and all(e["method"] == "POST" for e in searches)
    assert all(server.form(e)["form_id"] == "search-v1" for e in searches)
    assert all(e["content_type"] == "application/x-www-form-urlencoded" for e in searches)
    assert {server.form(e)["q"] for e in searches} == set(queries)
    assert all(e["method"] == "GET" for e in log if e["path"] != "/search")


def test_a_spider_with_start_requests_needs_no_seed_and_gets_json(tmp_path: Path) -> None:
    db = tmp_path / "api.db"
    with SandboxServer() as server:
        env = {"SANDBOX": server.base_url}
        done = run(crawl_cmd(db, "examples/api.py:LoadMore"), env=env)
        assert done.returncode == 0, done.stderr
        # A second run adds the start request again: a no-op, nothing is fetched.
        before = len(server.requests())
        again = run(crawl_cmd(db, "examples/api.py:LoadMore"), env=env)
        assert again.returncode == 0, again.stderr
        assert len(server.requests()) == before
    assert records(db) == expected_api(server.cfg)


def test_a_new_crawl_without_seeds_or_start_requests_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    done = run(crawl_cmd(db, "examples/catalog.py:Catalog"))
    assert done.returncode == 2
    assert "has no start_urls or start_requests" in done.stderr
    assert not db.exists()
