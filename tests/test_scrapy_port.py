"""docs/scrapy.md's claim: the Scrapy spider and its idemcrawl port give the same items."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from idemcrawl.lab.testsite.sandbox import SandboxServer, expected_items

from .helpers import run
from .test_sandbox_crawl import crawl_cmd, records


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
