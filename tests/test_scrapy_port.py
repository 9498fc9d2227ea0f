"""docs/scrapy.md's claims: the Scrapy spider and its idemcrawl port give the same items, and so
does the Scrapy spider with its habits kept (cb_kwargs, ::text, async callbacks…)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from idemcrawl.lab.testsite.sandbox import SandboxConfig, SandboxServer, expected_items

from .helpers import run
from .test_sandbox_crawl import _kill_after, crawl_cmd, records


@pytest.mark.slow
def test_scrapy_spider_and_its_port_agree(tmp_path: Path) -> None:
    pytest.importorskip("scrapy", reason="Scrapy is in the test extra")
    out = tmp_path / "items.json"
    with SandboxServer() as server:
        scrapy = run(
            [sys.executable, "-m", "scrapy", "runspider", "examples/scrapy_catalog.py",
             "-O", str(out), "-s", "LOG_LEVEL=ERROR"],
            env={"SANDBOX": server.base_url},
        )  # fmt: skip
        assert scrapy.returncode == 0, scrapy.stderr
        ours = run(
            crawl_cmd(
                tmp_path / "c.db", "examples/catalog.py:Catalog", f"{server.base_url}/catalog"
            )
        )
        assert ours.returncode == 0, ours.stderr
    scraped = {item.pop("key"): item for item in json.loads(out.read_text())}
    assert scraped == records(tmp_path / "c.db") == expected_items(server.cfg)


@pytest.mark.parametrize("workers", ["1", pytest.param("0", marks=pytest.mark.slow)])
def test_scrapy_habits_kept_give_the_same_items(tmp_path: Path, workers: str) -> None:
    """The Scrapy spider with its habits kept (cb_kwargs, ::text, .get(), an async callback,
    allowed_domains, custom_settings, self.logger), in parser processes and in the crawl
    process (parse_workers 0, where the crawl's event loop already runs)."""
    db = tmp_path / "h.db"
    spider = "tests.sandbox_spiders:ScrapyHabits"
    with SandboxServer() as server:
        cmd = crawl_cmd(db, spider, f"{server.base_url}/catalog")
        done = run([*cmd, "--parse-workers", workers])
        assert done.returncode == 0, done.stderr
    assert records(db) == expected_items(server.cfg)
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT callback, data FROM requests").fetchall()
    finally:
        con.close()
    assert len(rows) == 20
    for callback, data in rows:  # the cb_kwargs, stored with each detail URL
        assert callback == "parse_item"
        context, kwargs = json.loads(data)
        assert context == {} and set(kwargs) == {"category", "rank", "listing_page"}


@pytest.mark.slow
def test_cb_kwargs_survive_sigkill(tmp_path: Path) -> None:
    """Killed 6 times mid-crawl, then run to the end: every item has its listing's
    cb_kwargs, whichever process parsed it."""
    cfg = SandboxConfig(pages=6, per_page=5, latency_ms=25)
    db = tmp_path / "k.db"
    with SandboxServer(cfg) as server:
        cmd = crawl_cmd(db, "tests.sandbox_spiders:ScrapyHabits", f"{server.base_url}/catalog",
                        concurrency=3)  # fmt: skip
        landed = sum(_kill_after(server, cmd, 3 + i % 3) for i in range(6))
        assert landed >= 4
        done = run(cmd, timeout=120)
        assert done.returncode == 0, done.stderr
    assert records(db) == expected_items(cfg)
