"""``bench startup``: the frontier it builds and the figures it reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from idemcrawl.frontier import open_frontier
from idemcrawl.lab.bench.startup import build, report, run_startup_bench

from ...helpers import run_cli


def test_build_makes_the_frontier_it_says(tmp_path: Path) -> None:
    db = str(tmp_path / "f.db")
    build(db, "http://127.0.0.1:9", 3_000, 700, log=lambda _: None)
    f = open_frontier(db)
    try:
        by_state = f.stats().urls_by_state
        assert by_state["done"] == 700 and by_state["queued"] == 2_300
        assert len(list(f.body_digests())) == 700
        assert len(list(f.simhashes())) == 700
    finally:
        f.close()


@pytest.mark.slow
def test_the_crawl_is_timed_to_its_first_request() -> None:
    empty, built = run_startup_bench(2_000, 200)
    for fig in (empty, built):
        assert 0 < fig.first_request_s < 60
        assert 10 < fig.rss_mb <= fig.rss_with_children_mb
    assert (empty.urls, built.urls, built.done) == (0, 2_000, 200)
    assert "2,000 URLs (200 done): first request after" in report([empty, built], False)


def test_done_above_urls_is_a_usage_error() -> None:
    res = run_cli("bench", "startup", "--urls", "10", "--done", "20")
    assert res.returncode == 2 and "--done must not exceed --urls" in res.stderr
