"""A crawl of the trap site ends on its own, cuts every trap at its limit, keeps every product."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemcrawl.engine import run_crawl
from idemcrawl.frontier.sqlite import SQLiteFrontier
from idemcrawl.lab.testsite.traps import PRODUCTS, TrapServer, TrapSite, product_price

from .conftest import crawl_config


@pytest.fixture
def trap_site() -> Iterator[tuple[TrapSite, str]]:
    with TrapServer() as server:
        yield server.site, server.base_url


def test_traps_are_cut_and_products_kept(trap_site: tuple[TrapSite, str], tmp_path: Path) -> None:
    site, base = trap_site
    db = tmp_path / "c.db"
    summary = run_crawl(
        crawl_config(
            db,
            f"{base}/",
            spider="idemcrawl.lab.testsite.trap_spider:TrapShopSpider",
            concurrency=8,
            host_concurrency=8,
            template_growth_limit=40,
            template_sample_every=20,
            max_depth=60,
            max_query_params=4,
        )
    )
    assert summary.finished
    f = SQLiteFrontier(str(db))
    records = {r["key"]: json.loads(r["data"])["price"] for r in f.records()}
    stats = f.stats()
    same = [f.url_row(f"{base}/same/{k}") for k in range(1, 4)]
    pdfs = [f.url_row(f"{base}/files/{n}.pdf") for n in ("manual", "copy")]
    near = [f.url_row(f"{base}/near/{k}") for k in range(1, 6)]
    f.close()
    # R11: three byte-identical bodies are archived once; the others point at that copy.
    assert len({(r["warc_file"], r["warc_offset"]) for r in same}) == 1
    assert stats.counters["content_duplicates"] >= 2  # /a/a/… pages are identical too
    # Near-duplicates (one sentence differs) form one group under the first fetched, their
    # revisit interval is stretched, and each one's unique link was still followed.
    roots = [r["url_id"] for r in near if r["near_dup_of"] is None]
    assert len(roots) == 1
    assert all(r["near_dup_of"] in (None, roots[0]) for r in near)
    member = next(r for r in near if r["near_dup_of"] is not None)
    root = next(r for r in near if r["near_dup_of"] is None)
    assert member["revisit_interval"] > root["revisit_interval"]
    assert stats.counters["near_duplicates"] >= 4  # trap pages are near-duplicates too
    assert site.hits["/leaf/"] == 5
    assert records == {f"T-{n:03d}": product_price(n) for n in range(1, PRODUCTS + 1)}
    hits = site.hits
    # Each trap family is cut: a paused template admits 1 in 20 after 40, depth stops at 60.
    assert hits["/cal/"] <= 60 + 10
    # All query variants of /shop count as one family: 40, then 1 in 20 of the new ones.
    paused = stats.counters["links_rejected_template_paused"]
    assert hits["/shop"] <= 40 + (hits["/shop"] + paused) / 20 + 5
    assert hits["/s;"] <= 60
    assert hits["/a/"] <= 4  # /a/, /a/a/, /a/a/a/ then the repeated-segment limit
    assert stats.urls_by_state["rejected"] > 0
    rejected = {k: v for k, v in stats.counters.items() if k.startswith("links_rejected_")}
    assert rejected.get("links_rejected_template_paused", 0) > 0
    assert rejected.get("links_rejected_repeated_segment", 0) > 0
    assert rejected.get("links_rejected_query_params", 0) > 0
    assert stats.counters["template_paused"] >= 2  # at least the calendar and the facets
    # Downloads the spider asked for are kept once, by content hash, and never parsed.
    assert site.hits["/files/"] == 2
    assert pdfs[0]["kind"] == "download" and pdfs[0]["stored_file"] == pdfs[1]["stored_file"]
    files = list((tmp_path / "c.db.warc" / "files").iterdir())
    assert [p.name for p in files] == [Path(pdfs[0]["stored_file"]).name]
    assert files[0].name.endswith(".pdf") and files[0].read_bytes().startswith(b"%PDF")
    assert stats.counters["downloads"] == 2
    # R9/R10 end to end: four spellings of /p/1 are one fetch; query order is kept (two URLs).
    assert site.paths["/p/1"] == 1
    assert site.paths["/p/2?a=1&b=2"] == 1 and site.paths["/p/2?b=2&a=1"] == 1
