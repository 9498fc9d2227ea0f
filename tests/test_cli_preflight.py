"""Forgetting ``--allow-private`` is a configuration error: one line, nothing written (#18)."""

from __future__ import annotations

import json
from pathlib import Path

from idemcrawl.lab.testsite import ShopServer, expected_products

from .conftest import SHOP_SPIDER
from .helpers import run_cli


def test_loopback_seed_without_the_flag_then_with_it(shop: ShopServer, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    common = [shop.seed_url, "--db", str(db), "--spider", SHOP_SPIDER, "--delay", "0"]
    res = run_cli("crawl", *common)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "loopback address 127.0.0.1" in lines[0]
    assert "--allow-private 127.0.0.1" in lines[0]
    assert not db.exists()  # nothing remembered: no robots failure, no deferred host
    assert shop.stats()["total"] == 0  # and no request left the machine's crawler

    res = run_cli(
        "crawl", *common, "--allow-private", "127.0.0.1", "--host-concurrency", "4", "--json"
    )
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["finished"] is True
    out = tmp_path / "r.jsonl"
    assert run_cli("export", "--db", str(db), "-o", str(out)).returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["key"]: r["data"]["price"] for r in rows} == expected_products(shop.cfg)


def test_render_without_a_browser_is_one_line_and_writes_nothing(
    shop: ShopServer, tmp_path: Path
) -> None:
    db = tmp_path / "c.db"
    res = run_cli(
        "crawl", shop.seed_url, "--db", str(db), "--allow-private", "127.0.0.1", "--render",
        env={"IDEMCRAWL_CHROMIUM": str(tmp_path / "no-such-browser")},
    )  # fmt: skip
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no Chromium found for rendering" in lines[0], res.stderr
    assert not db.exists()
    assert shop.stats()["total"] == 0
