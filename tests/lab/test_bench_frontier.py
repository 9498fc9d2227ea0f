"""`bench frontier` reports sane figures on a tiny run (a benchmark's own smoke test)."""

from __future__ import annotations

from idemcrawl.lab.bench.frontier import FrontierBenchOptions, run_frontier_bench


def test_frontier_bench_counts_and_sizes() -> None:
    r = run_frontier_bench(FrontierBenchOptions(hosts=20, urls_per_host=3, lease_batch=8))
    assert r.seeded_urls == 60
    assert r.grants == r.completions >= 60
    # every completion discovered 10 new URLs; nothing is lost or duplicated
    assert r.known_urls == 60 + 10 * r.completions
    assert r.grants_per_s > 0 and r.completions_per_s > 0
    assert 50 < r.bytes_per_url < 5000
    assert "lease grants" in r.text()
